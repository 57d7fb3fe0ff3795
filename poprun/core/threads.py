"""
Threads that never take poprun's stop signals: every thread poprun starts is started here.

Layer: ``poprun.core``; the standard library only (``signal``, ``threading``).

The kernel gives a signal sent to a process to any one of its threads that does not block
it: the main thread when it can, but another one when the main thread already has a signal
pending (a SIGCHLD on a busy machine) or when the whole process was stopped (SIGSTOP, then
SIGCONT: the first thread to run takes it). CPython runs a handler only in the main thread,
and only once that thread leaves what it waits in; a signal taken by another thread merely
sets a flag, so a main thread waiting without a timeout (a launch's ``wait``) never sees it:
``poprun stop`` and Ctrl-C were then ignored until the run ended by itself. A thread started
with :func:`spawn` blocks :data:`STOPS` from its first instruction (a thread inherits the
mask of the thread that starts it, so the threads it starts block them too): the kernel then
always gives these signals to the main thread, and its wait is interrupted at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

STOPS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP})
"""The signals whose handlers stop or suspend poprun (``poprun.cli.run``): only the main thread takes them."""


def spawn(target: Callable[..., object], *, name: str | None = None, args: tuple[object, ...] = (),
          daemon: bool = True) -> threading.Thread:
    """Start and return a thread running ``target(*args)`` with :data:`STOPS` blocked in it."""
    thread = threading.Thread(target=target, name=name, args=args, daemon=daemon)
    start_thread(thread)
    return thread


def start_thread(thread: threading.Thread) -> None:
    """Start ``thread`` (made, not started) with :data:`STOPS` blocked in it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
