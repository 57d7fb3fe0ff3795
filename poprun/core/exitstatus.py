"""
poprun's exit statuses, defined once (design.md section 3).

Layer: ``poprun.core``; imports nothing (host-side shell text formats these numbers in).

Besides these, poprun exits with the root cause's own status: the first instance to fail that
poprun did not stop, its exit code or 128+N for signal N. ``submit --wait`` and ``attach``
exit with the job's or run's status; ``vipu-server`` with 1 when it cannot listen, 2 for bad
arguments.

========  =====================  ==============================================================
status    name                   when
========  =====================  ==============================================================
0         ``OK``                 success; ``plan --diff``; ``--detach`` once all started;
                                 ``stop`` once the run ended
1         ``FAILURE``            instances succeeded but output could not be written
1         ``NOT_NOW``            a run not in a state to act on (PR603, PR604, PR607, PR608)
2         ``USAGE``              spec or command-line error, nothing started; RUN, instance or
                                 attempt not found, record unreadable (PR600-PR602, PR605, PR609)
124       ``TIMED_OUT``          ``--timeout`` or ``--stall-timeout`` ended the run (timeout(1)'s);
                                 an instance hung (``--heartbeat-timeout``) or was a straggler
                                 (``--straggler-policy restart``) with no restart left (also
                                 the status of such an attempt, which a restart may follow)
125       ``CANNOT_LAUNCH``      could not launch; the root cause's host lost; the backend failed
                                 running; internal error; ``attach`` to a lost run
126       ``NOT_EXECUTABLE``     the program is not executable
127       ``NOT_FOUND``          the program is not found (``submit``: no ``sbatch``)
129       ``HANGUP``             stopped by SIGHUP with no instance to blame
130       ``INTERRUPTED``        stopped by SIGINT with no instance to blame; ``attach`` detached
141       ``BROKEN_PIPE``        poprun's stdout or stderr closed (SIGPIPE semantics, silently)
143       ``TERMINATED``         stopped by SIGTERM with no instance to blame
========  =====================  ==============================================================
"""

OK = 0
FAILURE = 1  # the instances succeeded, but their output could not be written (stdout on a full disk)
NOT_NOW = FAILURE  # the run is not in a state the command can act on
USAGE = 2  # a spec or command-line error: nothing was started
TIMED_OUT = 124  # a time limit ended the run, as timeout(1) says; or a hung instance, a straggler (policy restart)
CANNOT_LAUNCH = 125  # poprun itself could not launch
NOT_EXECUTABLE = 126
NOT_FOUND = 127
SIGNALLED = 128  # 128+N: stopped by signal N, as the shell says
HANGUP = 129  # 128 + SIGHUP
INTERRUPTED = 130  # 128 + SIGINT
BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout was closed, as a tool killed by it
TERMINATED = 143  # 128 + SIGTERM

LAUNCH_STATUSES = (CANNOT_LAUNCH, NOT_EXECUTABLE, NOT_FOUND)
"""What a :class:`~poprun.core.diagnostic.LaunchError` may carry."""
