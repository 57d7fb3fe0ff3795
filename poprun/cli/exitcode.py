"""
Exit statuses of the commands, by the names the CLI uses; defined in :mod:`poprun.core.exitstatus`.

Layer: ``poprun.cli``; imports :mod:`poprun.core.exitstatus` only.
"""

from poprun.core.exitstatus import CANNOT_LAUNCH as LAUNCH
from poprun.core.exitstatus import FAILURE, INTERRUPTED, NOT_EXECUTABLE, NOT_FOUND, OK, USAGE

__all__ = ["FAILURE", "INTERRUPTED", "LAUNCH", "NOT_EXECUTABLE", "NOT_FOUND", "OK", "USAGE"]
