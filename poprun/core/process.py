"""
A process's identity on this machine: its pid and when it started, so that a reused pid is never taken for it.

Layer: ``poprun.core``; the standard library only (Linux ``/proc``).
"""

from __future__ import annotations

_STARTTIME = 19  # field 22 of /proc/PID/stat, counted after the command name


def start_time(pid: int, *, zombie: bool = True) -> int | None:
    """
    Return when process ``pid`` started (clock ticks after boot), or None when it is gone.

    With ``zombie`` False, a process that has ended but is not reaped yet counts as gone.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:  # pathlib costs start-up
            fields = file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) <= _STARTTIME or (not zombie and fields[0] == b"Z"):
        return None
    return int(fields[_STARTTIME])
