"""The declared protocol: ``Launch.forward`` called directly (never looked up), and the sinks' ``instance_output``."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from poprun.apply import Control
from poprun.backends import _plugin
from poprun.backends.base import InstanceSink, Launch, Stream
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.testing import RecordingBackend
from poprun.core.diagnostic import DiagnosticError
from poprun.process.output import Router

PLUGIN = _plugin.Plugin("gpu", "declared by distribution 'gpu-backend 1.0' (gpu_backend:Gpu)", "gpu-backend")


class OldLaunch:
    """A plugin's launch written before ``forward`` was declared: wait and terminate only."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def wait(self) -> object:
        return self.inner.wait()  # type: ignore[attr-defined]

    def terminate(self, grace_s: float) -> None:
        self.inner.terminate(grace_s)  # type: ignore[attr-defined]


class _Run:
    """The run's state as a control sees it (apply's ``Run``), holding one launch."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch

    def stop(self, signum: int, why: str, grace_s: float) -> None:
        """Nothing to stop in this test."""

    def output_closed(self, why: str, grace_s: float) -> None:
        """Nothing to stop in this test."""


def test_the_control_forwards_to_the_launch_itself(tmp_path: Path) -> None:
    # GIVEN a control whose launch is the test double's
    launch = RecordingBackend().launch(probe_plan("pass", tmp_path, backend="recording"), env_source={},
                                       sink=MemorySink())
    control = Control()
    control.forward(signal.SIGTSTP)  # before any launch: nothing to send it to
    control.bind(_Run(launch))

    # WHEN
    control.forward(signal.SIGUSR1)
    control.forward(signal.SIGCONT)

    # THEN
    assert [signal.SIGUSR1, signal.SIGCONT] == launch.forwarded


def test_a_plugin_launch_without_forward_ends_its_run_with_pr462_never_silently(tmp_path: Path) -> None:
    # GIVEN
    inner = RecordingBackend().launch(probe_plan("pass", tmp_path, backend="gpu"), env_source={}, sink=MemorySink())
    guarded = _plugin.GuardedLaunch(OldLaunch(inner), PLUGIN)  # type: ignore[arg-type]

    # WHEN
    guarded.forward(signal.SIGUSR1)  # from a signal handler or the limit's thread: nothing raised here
    with pytest.raises(DiagnosticError) as caught:
        guarded.wait()

    # THEN
    (diagnostic,) = caught.value.diagnostics
    expected = ("'gpu' is declared by distribution 'gpu-backend 1.0' (gpu_backend:Gpu); its forward() raised "
                "AttributeError: 'OldLaunch' object has no attribute 'forward'")

    assert ("PR462", expected) == (diagnostic.code, diagnostic.detail)


def test_a_plugin_launch_with_forward_gets_the_signal(tmp_path: Path) -> None:
    inner = RecordingBackend().launch(probe_plan("pass", tmp_path, backend="gpu"), env_source={}, sink=MemorySink())
    guarded = _plugin.GuardedLaunch(inner, PLUGIN)

    guarded.forward(signal.SIGUSR2)

    assert ([signal.SIGUSR2], (0, 0)) == (inner.forwarded, guarded.wait().statuses)


class Kept(MemorySink, InstanceSink):
    """An InstanceSink: every piece of lines and every read, by instance."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[tuple[int, Stream, bytes]] = []
        self.reads: list[int] = []

    def instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        self.pieces.append((index, stream, data))

    def instance_output(self, index: int) -> None:
        self.reads.append(index)


def test_the_router_tells_an_instance_sink_of_every_read_and_keeps_its_lines(tmp_path: Path) -> None:
    # GIVEN
    sink = Kept()
    router = Router(probe_plan("pass", tmp_path, backend="local"), sink)

    # WHEN: a progress bar's carriage return (no line ends), then a line
    router.feed(1, "stdout", b"40%\r")
    router.feed(1, "stdout", b"done\n")
    router.close()

    # THEN
    assert ([1, 1], [(1, "stdout", b"40%\rdone\n")]) == (sink.reads, sink.pieces)


def test_the_router_asks_nothing_more_of_a_plain_sink(tmp_path: Path) -> None:
    sink = MemorySink()
    router = Router(probe_plan("pass", tmp_path, backend="local"), sink)

    router.feed(0, "stdout", b"line\n")
    router.close()

    assert b"line\n" == sink.data()
