"""
Adversarial checks of the ssh backend's parts for many hosts (docs/scale.md), without hosts.

Tests marked xfail(strict=True) record a failure found when they were written ("FINDING: ..."); the
others guard what held.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.backends.base import LaunchError
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.ssh.backend import SshBackend
from poprun.backends.ssh.fanout import FANOUT, window
from poprun.backends.ssh.relay import relays
from poprun.core.record import evolve
from poprun.planner.plan import BackendSetting, LaunchPlan


@pytest.mark.parametrize("value", [
    "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() is True, int() refuses it
    "\u2460",  # CIRCLED DIGIT ONE: the same
    "9" * 5000,  # past Python's 4300-digit limit for int()
])
def test_a_fanout_that_only_looks_like_digits_is_refused_naming_the_variable(value: str) -> None:
    """
    POPRUN_SSH_FANOUT=² (a pasted superscript) or 5000 nines: the launch's error is str(ValueError), which is
    here "invalid literal for int() with base 10: '²'" or "Exceeds the limit (4300 digits) ...": the user is
    not told which setting is wrong.
    """
    with pytest.raises(ValueError, match=FANOUT):
        window({FANOUT: value})


def test_a_fanout_of_other_scripts_digits_is_refused_or_read_as_its_number() -> None:
    """Arabic-Indic or full-width digits: either the number they write, in range, or the error naming the variable."""
    for value, number in (("\u0661\u0662", 12), ("\uff18", 8)):
        try:
            assert number == window({FANOUT: value})
        except ValueError as exc:
            assert FANOUT in str(exc)


def _with_setting(plan: LaunchPlan, name: str, value: str) -> LaunchPlan:
    """Return ``plan`` with setting ``name`` recorded as ``value`` (a plan made by hand: the solver refuses junk)."""
    given = BackendSetting(name=name, value=value, source=f"environment variable {name}")
    return evolve(plan, backend=evolve(plan.backend, settings=(given,)))


def test_prepare_never_raises_for_a_junk_host_timeout(tmp_path: Path) -> None:
    """
    Prepares.prepare's contract: never raises (what fails, the launch reports). With POPRUN_HOST_TIMEOUT=junk
    (in a plan made by hand: the solver refuses it, PR225) it raised LaunchError, which the apply step does not
    expect there (it escaped apply() as an internal error; see tests/e2e/hosts/test_scale_adversarial.py).
    """
    plan = probe_plan("pass", tmp_path, backend="ssh", instances=2, hosts=("poprun-nowhere.invalid",))
    backend = SshBackend()
    try:
        backend.prepare(_with_setting(plan, "POPRUN_HOST_TIMEOUT", "junk"), environ={"PATH": "/usr/bin:/bin"})
    except LaunchError as exc:
        pytest.fail(f"prepare raised: {exc}")
    finally:
        backend.close()


def test_prepare_returns_quietly_for_junk_fanout_and_relay_settings(tmp_path: Path) -> None:
    """A junk POPRUN_SSH_FANOUT or POPRUN_SSH_RELAY in the plan: prepare opens nothing and keeps nothing (the launch says why)."""
    plan = probe_plan("pass", tmp_path, backend="ssh", instances=2, hosts=("poprun-nowhere.invalid",))
    for name, value in (("POPRUN_SSH_FANOUT", "lots"), ("POPRUN_SSH_RELAY", "sometimes")):
        backend = SshBackend()
        backend.prepare(_with_setting(plan, name, value), environ={"PATH": "/usr/bin:/bin"})
        assert backend._kept is None



@pytest.mark.parametrize("count", [3, 4, 10, 257, 1000])
def test_every_host_is_reached_once_and_no_relay_is_a_leaf(count: int) -> None:
    """relays(): every leaf's relay is a host of the list that is itself reached directly, and comes before it."""
    hosts = [f"n{i}" for i in range(count)]
    via = relays(hosts, "on")

    assert set(via.values()) <= set(hosts) - set(via)
    assert all(hosts.index(relay) < hosts.index(leaf) for leaf, relay in via.items())


@pytest.mark.parametrize(("name", "value"), [("POPRUN_SSH_FANOUT", "lots"), ("POPRUN_SSH_RELAY", "sometimes"),
                                             ("POPRUN_HOST_TIMEOUT", "junk")])
def test_a_hand_made_plans_junk_setting_is_pr225_at_launch_with_nothing_started(tmp_path: Path, name: str,
                                                                                   value: str) -> None:
    """A plan made by hand (the solver refuses junk) with a junk ssh setting: launch raises PR225 naming it, 125."""
    plan = _with_setting(probe_plan("pass", tmp_path, backend="ssh", instances=2,
                                    hosts=("poprun-nowhere.invalid",)), name, value)
    backend = SshBackend()
    try:
        with pytest.raises(LaunchError) as raised:
            backend.launch(plan, env_source={"PATH": "/usr/bin:/bin"}, sink=MemorySink())
    finally:
        backend.close()

    diagnostic = raised.value.diagnostics[0]
    assert (125, "PR225", f"<env {name}>") == (raised.value.status, diagnostic.code, diagnostic.span.file)
    assert repr(value) in diagnostic.detail or value in diagnostic.detail
