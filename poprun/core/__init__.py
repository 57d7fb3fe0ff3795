"""
The lowest layer of poprun: source spans, diagnostics, hints and host lists.

Layer: ``poprun.core``; imports only the standard library.

Glossary (PopRun's own terms, used everywhere; no synonyms):

- *replica*: one copy of the Poplar graph. ``num_replicas`` counts them all.
- *IPUs per replica*: how many IPUs one replica spans.
- *instance*: one operating-system process that controls a contiguous block of
  replicas. Instance ``i`` controls replicas ``[i*r, (i+1)*r)``.
- *instance index*: the position of an instance among all instances, from 0.
- *local instance index*: the position of an instance among those on its host.
- *replica offset*: the global index of an instance's first replica.
- *host*: a machine that runs instances.
- *ILD*: an IPU-Link domain, a set of IPUs connected by IPU-Links.
- *GCD*: a graph compile domain; in multi-instance runs each instance has its own.
- *partition*: the V-IPU partition whose IPUs the instances use.

poprun's own terms:

- *run*: one launch of a plan, from ``RunStarted`` to ``RunEnded``, with an id and a run record.
- *attempt*: one launch of every instance within a run (attempt 0, then one per restart of
  scope ``all``); with scope ``instance``, each restarted instance counts as an attempt.
- *restart*: starting again after a failure, as the plan's recovery allows;
  ``POPRUN_RESTART_COUNT`` counts those before the current attempt.
- *relay*: what passes things on without deciding: an ssh relay host that starts its leaf
  hosts, the mpirun output relay, apply's relay (the sink a backend writes to).
- *session*: one ``poprun`` command; its *backend session* is one registry and the backends it
  made, closed at the end. An ssh session is one channel.
- *trait*: a fact about a backend that planning or apply needs (runs every instance here;
  reaches hosts by ssh, srun, mpirun or not at all; restarts one instance; finds a missing cwd
  only once started): data in a table, recorded in the plan's backend record.
- *capability*: what a backend promises beyond the protocol; it selects conformance checks.
- *setting*: a ``POPRUN_*`` variable that is not an option's fallback (``POPRUN_SSH_FANOUT``).
- *record*: a frozen value class (``@record``); a *run record* is one run's directory. Say which.
- *supervisor*: the poprun process that runs a run; *phase*: a timed part of a launch
  (connect, preflight, start, first-output); *limit*: ``--timeout`` or ``--stall-timeout``.
"""
