"""
``poprun``: the classic command line, the ``plan``, ``validate``, ``apply``, ``render`` and ``submit`` commands, and those over run records.

Layer: ``poprun.cli``. Imports are lazy so that ``poprun --version`` starts fast.
A subcommand is recognised only as the first argument (a row of the command table,
:data:`poprun.cli.commands.COMMANDS`); anything else is the classic form.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from poprun import __version__
from poprun.cli import exitcode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.session import Session


def main(argv: Sequence[str] | None = None) -> int:
    """Run poprun with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):
        sys.stdout.write(f"poprun {__version__}\n")
        return exitcode.OK
    from poprun.cli.session import Session
    from poprun.core.diagnostic import DiagnosticError, LaunchError

    session = Session()
    try:
        return _dispatch(args, session)
    except LaunchError as exc:  # a backend's, met outside apply (the hosts' topologies while planning): its status
        if exc.diagnostics:
            session.report(tuple(exc.diagnostics))
        else:
            sys.stderr.write(f"poprun: {exc.message}\n")
        return exc.status
    except DiagnosticError as exc:
        session.report(tuple(exc.diagnostics))
        return exitcode.USAGE
    except KeyboardInterrupt:
        return exitcode.INTERRUPTED
    except Exception as exc:  # a bug: one line, and the traceback only when asked for
        if os.environ.get("POPRUN_DEBUG"):
            raise
        sys.stderr.write(f"poprun: internal error: {type(exc).__name__}: {exc} "
                         "(please report it; POPRUN_DEBUG=1 shows the traceback)\n")
        return exitcode.LAUNCH


def entry() -> None:
    """
    Run :func:`main` and exit at once with its status: the ``poprun`` console script.

    Everything poprun starts has ended and been reaped when :func:`main` returns, so the
    interpreter's own clean-up (tearing down every imported module, some 6 ms: an eighth of
    poprun's start-up budget) has nothing left to do; the output streams are flushed and the
    process exits without it. A traceback asked for with ``POPRUN_DEBUG`` still prints.

    A standard descriptor that is closed (``poprun ... <&-``, ``>&-``) is opened on ``/dev/null``
    first, so that no pipe or file poprun opens takes its number (instance 0 would read it as
    stdin, poprun's output would go into it).
    """
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
        if getattr(sys, name) is None:  # Python found it closed
            setattr(sys, name, open(fd, "w" if fd else "r", closefd=False))  # noqa: SIM115 - kept for good
    _visible_streams()
    status = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing more can reach it
            stream.flush()
    os._exit(status)


def _visible_streams() -> None:
    r"""Write a byte that is not UTF-8 (read from argv with ``surrogateescape``) as ``\xHH``, never raw, never a crash."""
    from poprun.core.rawbytes import VISIBLE, register

    register()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # not a text file of ours
            stream.reconfigure(errors=VISIBLE)  # type: ignore[union-attr]


def _dispatch(args: list[str], session: Session) -> int:
    from poprun.cli.commands import BY_NAME, handler

    if not args or args[0] not in BY_NAME or args[0] == "apply":  # a launch may follow: ready the kernel's cgroup move
        from poprun.process.cgroup import prime

        prime()
    if args and args[0] in BY_NAME:
        return handler(args[0])(args[1:], session)
    return handler(None)(args, session)


if __name__ == "__main__":
    entry()
