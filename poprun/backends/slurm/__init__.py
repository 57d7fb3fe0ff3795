"""
The ``slurm`` backend: :mod:`.backend` (one srun step inside an allocation) and :mod:`.batch` (the ``sbatch`` script).

Layer: ``poprun.backends``; see :mod:`.backend`. Importing this package imports nothing more.
"""
