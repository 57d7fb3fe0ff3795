"""
Process machinery the built-in backends share: the layer below them (a plugin may not rely on it).

Layer: ``poprun.process``; imports ``poprun.core`` (the launch values of
:mod:`poprun.core.launching`) and ``poprun.planner.plan``; never ``poprun.backends``. :mod:`.instance` starts one instance as a
child process (finding its program, its stdin, its CPU binding), :mod:`.supervisor` runs the
children of a launch to their end, :mod:`.launcher` does the same for one launcher process
(mpirun, srun) that starts them all, :mod:`.output` routes their output, :mod:`.watchdog` and
:mod:`.cgroup` make sure nothing outlives poprun, :mod:`.files` makes and removes private
directories (only those it made), :mod:`.numa` sets a memory policy.
"""
