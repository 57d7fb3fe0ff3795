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
"""
