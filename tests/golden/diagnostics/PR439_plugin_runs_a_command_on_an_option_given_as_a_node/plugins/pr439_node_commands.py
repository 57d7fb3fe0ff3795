"""A backend plugin of the golden cases: its launch runs a command on node '-n1' through the slurm backend's own way."""

import os

from poprun.backends.slurm.hostcommand import run_on_host


class Backend:
    name = "nodes"

    def launch(self, _plan: object, **_arguments: object) -> None:
        run_on_host("-n1", "true", environ={"SLURM_JOB_ID": "1", "PATH": os.environ["PATH"]}, timeout_s=5)
