"""
The ``ssh`` backend, in layers (each imports only those below it; an import-linter contract keeps it so).

- :mod:`.backend`: :class:`~.backend.SshBackend`, the protocol's face (launch, prepare, probe, host commands);
- :mod:`.running` (the running launch), :mod:`.hostcommand` (a command on a host), :mod:`.probe`
  (other hosts' topologies);
- :mod:`.preflight`: every host checked before anything starts (PR405-PR409, PR413);
- :mod:`.remote`: the host-side shell scripts, as text;
- :mod:`.client`: :class:`~.client.SshClient`, the OpenSSH client and its shared connections;
- :mod:`.fanout`, :mod:`.relay`, :mod:`.sshkey` (``--distribute-ssh-key``).

Layer: ``poprun.backends``; see :mod:`.backend`. Importing this package imports nothing more.
"""
