"""
The emulated provider's client against hostile servers (real HTTP on 127.0.0.1): every answer that
is not a V-IPU answer is a coded diagnostic within the timeout, never a traceback or a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.partitions.actions import acquire
from poprun.partitions.emulated import EmulatedProvider
from poprun.partitions.provider import MalformedAnswerError, UnreachableError
from poprun.planner import plan
from tests.e2e.hostile import HostileServer, endless, http, reply, silent, trickle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]

PARTITION = {"name": "p16", "size": 16, "num_gcds": 1, "num_ilds": 1, "num_replicas": 1, "state": "PS_ACTIVE",
             "cluster": None, "allocation": None, "ipu_link_routing_type": None, "gw_link_routing_type": None,
             "sync_type": None, "reconfigurable": False, "leased_by": None}


def partitions(*items: object) -> bytes:
    return json.dumps({"partitions": list(items)}).encode()


def with_(**changes: object) -> dict[str, object]:
    return {**PARTITION, **changes}


def without(key: str) -> dict[str, object]:
    return {k: v for k, v in PARTITION.items() if k != key}


MALFORMED = {
    "a list instead of an object": (http("200 OK", b"[]"), "$: expected an object, got a list"),
    "partitions not a list": (http("200 OK", b'{"partitions": {}}'), "$.partitions: expected a list, got an object"),
    "a missing key": (http("200 OK", partitions(without("size"))), "$.partitions[0].size: missing"),
    "a negative size": (http("200 OK", partitions(with_(size=-16))), "$.partitions[0].size: expected an integer"),
    "a huge size": (http("200 OK", partitions(with_(size=10**30))), "$.partitions[0].size: expected an integer"),
    "a size that is text": (http("200 OK", partitions(with_(size="16"))), "got a string"),
    "a boolean for a number": (http("200 OK", partitions(with_(num_gcds=True))), "got a boolean"),
    "a name with NUL": (http("200 OK", partitions(with_(name="p\x00x"))), "$.partitions[0].name: control character"),
    "a state that is a number": (http("200 OK", partitions(with_(state=3))), "$.partitions[0].state"),
    "invalid UTF-8": (http("200 OK", b'{"partitions": ["\xff\xfe"]}'), "not JSON"),
    "invalid JSON": (http("200 OK", b"{partitions: ["), "not JSON"),
    "JSON nested without end": (http("200 OK", b"[" * 200000), "not JSON"),
    "an HTML error page": (http("502 Bad Gateway", b"<html>bad gateway</html>", "Content-Type: text/html"),
                           "HTTP 502 with a body that is not a V-IPU error"),
    "an error of the wrong shape": (http("500 Internal Server Error", b'{"error": 7}'),
                                    "HTTP 500 with a body that is not a V-IPU error"),
    "a redirect": (http("302 Found", b"{}", "Location: http://elsewhere.example/"),
                   "redirect (HTTP 302) to http://elsewhere.example/; poprun does not follow redirects"),
    "an answer that is not HTTP": (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP answer"),
    "closed mid-answer": (http("200 OK", b'{"partitions": []}')[:-5], "cut short"),
}


def test_an_answer_about_another_partition_is_malformed():
    """GET /v1/partitions/p16 answered with another partition: MalformedAnswerError, not that partition."""
    body = json.dumps({"partition": with_(name="other")}).encode()
    with HostileServer(reply(http("200 OK", body))) as server, pytest.raises(MalformedAnswerError) as caught:
        EmulatedProvider("127.0.0.1", server.port, timeout_s=5).get("p16")

    assert "GET /v1/partitions/p16: asked for partition 'p16', got 'other'" == caught.value.message


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_answer_is_a_malformed_answer_error(case):
    """Each answer of the wrong shape or encoding is MalformedAnswerError naming what is wrong."""
    raw, words = MALFORMED[case]
    with HostileServer(reply(raw)) as server, pytest.raises(MalformedAnswerError) as caught:
        EmulatedProvider("127.0.0.1", server.port, timeout_s=5).list()

    assert words in caught.value.message


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
], ids=["announced", "read until close"])
def test_a_huge_body_is_refused_at_the_cap(head):
    """A body larger than the cap (announced or streamed without end) is refused once the cap is passed."""
    with HostileServer(endless(head)) as server, pytest.raises(MalformedAnswerError) as caught:
        EmulatedProvider("127.0.0.1", server.port, timeout_s=10).list()

    assert "larger than 1 MiB" in caught.value.message


@pytest.mark.parametrize("behaviour", [
    trickle(http("200 OK", partitions(PARTITION))),
    trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000),
    silent,
], ids=["valid answer one byte at a time", "endless header one byte at a time", "no answer"])
def test_a_slow_or_silent_server_gets_the_timeout_in_total(behaviour):
    """The timeout bounds the whole exchange, not each read: a slowloris server is cut off at it."""
    with HostileServer(behaviour) as server:
        start = time.monotonic()
        with pytest.raises(UnreachableError) as caught:
            EmulatedProvider("127.0.0.1", server.port, timeout_s=1).list()
        took = time.monotonic() - start

    assert "no complete answer within 1 s" in caught.value.message
    assert took < 5  # a per-read timeout would wait until the test's own timeout


def test_control_characters_in_an_error_message_are_escaped():
    """The server's words reach the terminal with control characters escaped (no terminal escapes)."""
    body = json.dumps({"error": "refused", "message": "bad\x1b[2J\x07 size"}).encode()
    with HostileServer(reply(http("400 Bad Request", body))) as server, pytest.raises(Exception) as caught:
        EmulatedProvider("127.0.0.1", server.port, timeout_s=5).list()

    assert "bad\\x1b[2J\\x07 size" == caught.value.message  # type: ignore[attr-defined]


def partition(port: int, timeout_s: int = 5) -> plan.Partition:
    return plan.Partition(
        name="p16", allocation=None, server_host="127.0.0.1", server_port=port, timeout_s=timeout_s, num_ipus=16,
        num_gcds=1, num_ilds=1, sync_type=None, ipu_link_routing_type=None, gw_link_routing_type=None,
        update=True, reset=None, remove=True, attempts=1, actions=())


@pytest.mark.parametrize(("behaviour", "code"), [
    (reply(http("200 OK", b'{"partition": []}')), "PR510"),
    (reply(http("200 OK", b'{"partition": {"name": "p16"}}')), "PR510"),
    (trickle(http("200 OK", b"{}")), "PR501"),
])
def test_acquire_turns_a_hostile_answer_into_a_diagnostic(behaviour, code):
    """Through the partition step, a malformed answer is PR510 and a slowloris server PR501."""
    with HostileServer(behaviour) as server, pytest.raises(DiagnosticError) as caught:
        acquire(partition(server.port, timeout_s=1), EmulatedProvider("127.0.0.1", server.port, timeout_s=1),
                owner="t")

    assert [code] == [d.code for d in caught.value.diagnostics]


def test_the_cli_against_a_hostile_server_exits_125_with_pr510(tmp_path):
    """The real CLI: one diagnostic, exit 125, no traceback, the program never ran."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    with HostileServer(reply(http("200 OK", b'{"partition": {"name": "p16", "size": -1}}'))) as server:
        done = subprocess.run(
            [sys.executable, "-m", "poprun.cli.main", "--vipu-server-host", "127.0.0.1", "--vipu-server-port",
             str(server.port), "--vipu-server-timeout", "2", "--vipu-partition", "p16", "--num-replicas", "4",
             "sh", "-c", "echo ran"], cwd=tmp_path, env=env | {"POPRUN_PARTITION_PROVIDER": "emulated"},
            capture_output=True, text=True, timeout=20, check=False)

    assert (125, "") == (done.returncode, done.stdout)
    assert "error[PR510]" in done.stderr
    assert "$.partition.size: expected an integer" in done.stderr
    assert "Traceback" not in done.stderr



@pytest.mark.parametrize(("args", "env", "expected"), [
    (["--vipu-server-host", "a b"], {}, (2, "PR105", "not allowed in a host name")),  # refused while planning
    (["--vipu-partition", "p16"], {"POPRUN_VIPU_EMULATOR_INVENTORY": "inventory.json"},
     (125, "PR501", "cannot open the in-process emulated V-IPU service")),
], ids=["a server address with a space", "an inventory that is not JSON"])
def test_an_impossible_service_is_pr501_not_an_internal_error(tmp_path, args, env, expected):
    """An address http.client refuses, or an unreadable in-process inventory: PR501, never 'internal error'."""
    (tmp_path / "inventory.json").write_text("[1", encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", *args, "--num-replicas", "4", "true"], cwd=tmp_path,
                          env=clean | env | {"POPRUN_PARTITION_PROVIDER": "emulated"}, capture_output=True, text=True,
                          timeout=20, check=False)

    status, code, words = expected
    assert status == done.returncode, done.stderr
    assert f"error[{code}]" in done.stderr
    assert words in done.stderr
    assert "internal error" not in done.stderr


def test_planning_against_a_hostile_server_warns_and_plans(tmp_path):
    """`poprun plan` with a server answering nonsense: the PR502 warning with the reason, and the plan (exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    with HostileServer(reply(http("200 OK", b"[]"))) as server:
        done = subprocess.run(
            [sys.executable, "-m", "poprun.cli.main", "plan", "--vipu-server-host", "127.0.0.1", "--vipu-server-port",
             str(server.port), "--vipu-partition", "p16", "--num-replicas", "4", "true"], cwd=tmp_path,
            env=env | {"POPRUN_PARTITION_PROVIDER": "emulated"}, capture_output=True, text=True, timeout=20,
            check=False)

    assert 0 == done.returncode, done.stderr
    assert "warning[PR502]" in done.stderr
    assert "GET /v1/partitions: $: expected an object, got a list" in done.stderr
    assert "Traceback" not in done.stderr
