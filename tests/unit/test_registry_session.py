"""The backend session: one backend per name per registry, closed together by ``registry.close()``."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.apply import apply
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.registry import BackendRegistry, OnDemand, default_registry, topology_prober
from poprun.backends.ssh.backend import SshBackend
from poprun.backends.testing import RecordingBackend

NOWHERE = "poprun-nowhere.invalid"  # a name no resolver knows: ssh fails at once


class Closing(RecordingBackend):
    """A backend with local state: its ``close()`` is counted, in the order of every Closing's closes."""

    closed: list[str] = []  # noqa: RUF012 - shared on purpose: the order across backends

    def __init__(self, label: str, *, fails: bool = False) -> None:
        super().__init__()
        self.label, self.fails = label, fails

    def close(self) -> None:
        Closing.closed.append(self.label)
        if self.fails:
            msg = f"{self.label} could not close"
            raise OSError(msg)


class Events(MemorySink):
    """A sink that also hears events (the apply step's sink), and keeps none."""

    def event(self, event: object) -> None:
        pass


@pytest.fixture(autouse=True)
def no_closes_yet() -> None:
    Closing.closed.clear()


def test_get_gives_one_backend_per_name_per_registry() -> None:
    registry, other = default_registry(environ={"POPRUN_NO_PLUGINS": "1"}), default_registry(
        environ={"POPRUN_NO_PLUGINS": "1"})

    first, again, elsewhere = registry.get("ssh"), registry.get("ssh"), other.get("ssh")

    assert (True, False, False) == (first is again, first is elsewhere, first is registry.get("local"))


def test_close_closes_what_get_made_the_last_made_first_once_and_makes_nothing() -> None:
    # GIVEN a registry of three backends, two of them made, one of which has no close()
    made: list[str] = []

    def factory(label: str) -> Closing:
        made.append(label)
        return Closing(label)

    registry = BackendRegistry({"a": lambda: factory("a"), "b": lambda: factory("b"), "never": lambda: factory("never"),
                                "plain": RecordingBackend})
    registry.get("a")
    registry.get("plain")
    registry.get("b")

    # WHEN closed twice
    registry.close()
    registry.close()

    # THEN
    assert (["b", "a"], ["a", "b"]) == (Closing.closed, made)


def test_a_registry_used_again_after_close_makes_new_backends() -> None:
    registry = BackendRegistry({"a": lambda: Closing("a")})
    first = registry.get("a")
    registry.close()

    assert first is not registry.get("a")


def test_every_backend_is_closed_even_when_one_raises_and_the_first_error_is_raised_last() -> None:
    registry = BackendRegistry({"a": lambda: Closing("a", fails=True), "b": lambda: Closing("b", fails=True),
                                "c": lambda: Closing("c")})
    for name in ("a", "b", "c"):
        registry.get(name)

    with pytest.raises(OSError, match="b could not close"):
        registry.close()
    assert ["c", "b", "a"] == Closing.closed


def test_a_registry_closes_on_leaving_its_with_block_even_on_an_error() -> None:
    def use() -> None:
        with BackendRegistry({"a": lambda: Closing("a")}) as registry:
            registry.get("a")
            raise RuntimeError

    with pytest.raises(RuntimeError):
        use()
    assert ["a"] == Closing.closed


def test_on_demand_makes_its_registry_once_when_first_asked_and_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN
    made: list[BackendRegistry] = []

    def counted() -> BackendRegistry:
        registry = BackendRegistry({"a": lambda: Closing("a")})
        made.append(registry)
        return registry

    monkeypatch.setattr("poprun.backends.registry.default_registry", counted)

    # WHEN: nothing asked of one; the other asked twice
    with OnDemand():
        pass
    with OnDemand() as on_demand:
        on_demand().get("a")
        assert on_demand() is on_demand()

    # THEN
    assert (1, ["a"]) == (len(made), Closing.closed)


def test_the_topology_probe_uses_the_registrys_backend_which_keeps_its_client_until_closed() -> None:
    """
    The probe's ssh backend is the registry's own (the launch's), so the client it opened is kept on it,
    not in the module; the registry's close() closes it: no control directory is left.
    """
    # GIVEN
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    probe = topology_prober(registry)
    assert probe is not None

    # WHEN
    found = probe((NOWHERE,), environ={"PATH": "/usr/bin:/bin"})
    backend = registry.get("ssh")
    assert isinstance(backend, SshBackend)
    kept = backend._kept
    assert kept is not None
    registry.close()

    # THEN
    assert (True, True, False) == (isinstance(found[NOWHERE], str), kept.closed, Path(kept.directory).exists())


def test_mpirun_reaches_other_hosts_through_the_registrys_own_ssh_backend() -> None:
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})

    mpirun = registry.get("mpirun")

    assert registry.get("ssh") is mpirun._remote()  # type: ignore[attr-defined]


def test_an_ssh_backend_closes_the_client_it_kept_for_a_launch_that_never_came(tmp_path: Path) -> None:
    # GIVEN a client kept by prepare (its host unreachable: the launch would say so)
    backend = SshBackend()
    backend.prepare(probe_plan("pass", tmp_path, backend="ssh", instances=1, hosts=(NOWHERE,)),
                    environ={"PATH": "/usr/bin:/bin"})
    kept = backend._kept
    assert kept is not None

    # WHEN
    backend.close()
    backend.close()

    # THEN
    assert (None, True, False) == (backend._kept, kept.closed, Path(kept.directory).exists())


def test_apply_without_a_registry_closes_the_one_it_made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # GIVEN
    backend = Closing("recording")
    monkeypatch.setattr("poprun.apply.default_registry", lambda: BackendRegistry({"local": lambda: backend}))

    # WHEN
    result = apply(probe_plan("pass", tmp_path, backend="local"), sink=Events(), env_source={"PATH": "/usr/bin:/bin"})

    # THEN
    assert ((0, 0), ["recording"]) == (result.statuses, Closing.closed)
