"""The relay start's parts (poprun.backends.ssh.relay): which hosts relay for which, the mode, the relayed command."""

from __future__ import annotations

import math
import shlex
import subprocess

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poprun.backends.ssh.relay import RELAY, THRESHOLD, Routes, mode, relays


@given(st.integers(0, 5000), st.sampled_from(["on", "auto"]))
@example(7, "on")  # a last group of one host (7 = 3 + 3 + 1)
@example(2353, "on")
def test_groups_of_about_the_square_root_each_led_by_its_first_host(count: int, how: str) -> None:
    hosts = [f"n{i}" for i in range(count)]
    via = relays(hosts, how)
    if count < 3 or (how == "auto" and count < THRESHOLD):
        assert {} == via
        return
    leaders = set(via.values())
    size = math.ceil(math.sqrt(count))
    lone = count % size == 1  # the last group is one host: it has nobody to relay for, so it is reached directly
    assert leaders.isdisjoint(via)  # a relay is no leaf
    assert len(leaders) == math.ceil(count / size) - lone
    assert set(hosts) - set(via) - leaders == ({hosts[-1]} if lone else set())  # every other host relays or is a leaf
    assert all(hosts.index(relay) < hosts.index(leaf) for leaf, relay in via.items())  # in plan order
    assert max(list(via.values()).count(r) for r in leaders) <= size - 1


def test_off_never_relays() -> None:
    assert {} == relays([f"n{i}" for i in range(5000)], "off")


def test_on_relays_four_hosts_in_two_groups() -> None:
    assert {"h2": "h1", "h4": "h3"} == relays(["h1", "h2", "h3", "h4"], "on")


@pytest.mark.parametrize(("text", "expected"), [("", "auto"), (" ON ", "on"), ("off", "off"), ("auto", "auto")])
def test_the_mode_comes_from_the_environment(text: str, expected: str) -> None:
    assert expected == mode({RELAY: text} if text else {})


@pytest.mark.parametrize("text", ["yes", "1", "tree"])
def test_an_unknown_mode_says_which_are_known(text: str) -> None:
    with pytest.raises(ValueError, match=f"{RELAY}='{text}' is not one of auto, on, off"):
        mode({RELAY: text})


def test_a_leaf_runs_the_very_command_through_the_relays_ssh_with_poprun_options() -> None:
    command = "sh -c 'echo \"$x\" `y` $(z)'\nsecond line"
    routes = Routes({"leaf": "relay"}, ["ssh", "-F", "/a b/cfg", "-o", "BatchMode=yes"])

    relayed = routes.command("leaf", command)

    assert ("relay", "direct", command) == (routes.host("leaf"), routes.host("direct"), routes.command("direct", command))
    seen, _, leaf = relayed.partition("exec ")
    assert ["ssh", "-F", "/a b/cfg", "-o", "BatchMode=yes", "-T", "--", "leaf", "__poprun_via=$__poprun_s;",
            command] == shlex.split(leaf)
    assert seen.startswith("__poprun_s=${SSH_CONNECTION%% *};")
    assert 1 == routes.relay_count()


@pytest.mark.parametrize(("connection", "via"), [
    ("10.0.0.1 51000 10.0.0.2 22", "10.0.0.1"), ("fd00::1 51000 fd00::2 22", "fd00::1"), ("", ""),
    ("$(touch x) 1 2 3", ""), ("a;b 1 2 3", ""), ("'1 2 3 4", "")])
def test_a_leaf_is_told_poprun_s_address_as_its_relay_saw_it_and_only_an_address(connection: str, via: str) -> None:
    """The relay's shell expands its own SSH_CONNECTION's first field into the leaf's command: an IP address, else nothing."""
    routes = Routes({"leaf": "relay"}, ["printf", "%s\\n"])

    done = subprocess.run(["sh", "-c", routes.command("leaf", "echo leaf")], env={"SSH_CONNECTION": connection},
                          capture_output=True, text=True, check=True)

    assert ["-T", "--", "leaf", f"__poprun_via={via};", "echo leaf"] == done.stdout.splitlines()
