"""
The ``ssh`` backend: :mod:`.backend` (the launch), :mod:`.sshkey` (``--distribute-ssh-key``) and :mod:`.probe` (other hosts' topologies).

Layer: ``poprun.backends``; see :mod:`.backend`. Importing this package imports nothing more.
"""
