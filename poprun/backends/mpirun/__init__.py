"""
The ``mpirun`` backend, one module per part.

:mod:`.backend` (the launch), :mod:`.command` (the mpirun command line), :mod:`.mpistart`
(mpirun's settings and start-up failures), :mod:`.mpirelay` (the instances' output relay) and
:mod:`.mpiout` (what still comes through mpirun's pipes). Layer: ``poprun.backends``; see
:mod:`.backend`. Importing this package imports nothing more.
"""
