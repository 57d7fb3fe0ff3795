"""
The ``vipu`` adapter against misbehaving ``vipu`` tools: a coded diagnostic within the timeout, never a
traceback or a hang, and nothing of the tool left running.

Graphcore's ``vipu`` cannot run here (design.md section 10), so small shell scripts stand in for it on
PATH. The well-behaved parts print the recorded output of the real tool (tests/data/vipu/); each script
then misbehaves in one way: it hangs, floods, prints bytes that are not UTF-8, or prints something
that is not the table or the JSON the real tool prints.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.partitions.actions import acquire
from poprun.partitions.provider import MalformedAnswerError, ProviderError, UnreachableError
from poprun.partitions.vipu import VipuProvider
from poprun.planner import plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]

DATA = Path(__file__).parents[1] / "data" / "vipu"
TABLE = (DATA / "list-partitions-demo.txt").read_text(encoding="utf-8")
CONFIG = (DATA / "get-partition-ipuof-configs.json").read_text(encoding="utf-8")


def tool(folder: Path, list_partitions: str, get_partition: str = "cat config.json") -> VipuProvider:
    """Write a ``vipu`` script whose ``list`` and ``get`` run the given shell lines; return its provider."""
    (folder / "table.txt").write_text(TABLE, encoding="utf-8")
    (folder / "config.json").write_text(CONFIG, encoding="utf-8")
    script = folder / "vipu"
    script.write_text(f"""#!/bin/sh
cd '{folder}'
shift 4  # --api-host H --api-port P
case "$1 $2" in
  "list partitions") {list_partitions} ;;
  "get partition") {get_partition} ;;
  *) exit 0 ;;
esac
""", encoding="utf-8")
    script.chmod(0o755)
    return VipuProvider("127.0.0.1", 8090, timeout_s=2, path=f"{folder}:/usr/bin:/bin")


def test_the_stand_in_prints_what_the_real_tool_prints(tmp_path):
    """(The baseline) a well-behaved stand-in gives the recorded partition, completed by its configuration."""
    info = tool(tmp_path, "cat table.txt").get("p64")

    assert info is not None
    assert ("p64", 64, 1, True) == (info.name, info.size, info.num_replicas, info.reconfigurable)


MALFORMED = {
    "a proxy's page": ("echo '<html><body>502 Bad Gateway</body></html>'", "cat config.json",
                       "vipu list partitions: no partition table in its output, which starts '<html>"),
    "a table without a Partition column": ("echo ' Name | Size'; echo ' p64 | 64'", "cat config.json",
                                           "line 1 is not the header of a partition table"),
    "a size that is not a number": ("sed 's/ 64 / -64 /' table.txt", "cat config.json",
                                    "line 3: the size column holds '-64', not a count"),
    "a size of forty digits": ("sed 's/ 64 / 1234567890123456789012345678901234567890 /' table.txt",
                               "cat config.json", "the size column holds '1234567890123456789012345678901234567890'"),
    "a name with an escape": ("sed 's/p64 /p64\\x1b[2J/' table.txt", "cat config.json",
                              "line 3: the name column holds 'p64\\x1b[2J'"),
    "bytes that are not UTF-8": ("printf '\\377\\376 | Partition\\n'", "cat config.json",
                                 "vipu list partitions: its standard output is not UTF-8 (byte 0xff at offset 0)"),
    "a flood": ("yes '| Partition |'", "cat config.json", "vipu list partitions: it printed more than 1 MiB"),
    "a configuration that is a list": ("cat table.txt", "echo '[1, 2]'",
                                       "vipu get partition: its IPUoF configuration is not a JSON object"),
    "a configuration that is not JSON": ("cat table.txt", "echo '{attributes: '",
                                         "vipu get partition: its IPUoF configuration is not JSON"),
    "a configuration nested without end": ("cat table.txt", "yes '[' | head -c 500000",
                                           "vipu get partition: its IPUoF configuration is not JSON (nested too deeply)"),
    "an attribute of the wrong type": ("cat table.txt", """echo '{"attributes": {"Sync Type": [1]}}'""",
                                       "its IPUoF configuration's attribute 'Sync Type' is [1]"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_output_of_the_wrong_shape_is_a_malformed_answer(tmp_path, case):
    """Each kind of output that is not what the real tool prints is MalformedAnswerError saying what it is."""
    listing, getting, words = MALFORMED[case]
    with pytest.raises(MalformedAnswerError) as caught:
        tool(tmp_path, listing, getting).get("p64")

    assert words in caught.value.message


def test_a_hanging_tool_is_killed_with_what_it_started(tmp_path):
    """A vipu that never ends (nor its child, which holds the output pipe) is cut off at the timeout and killed."""
    vipu = tool(tmp_path, "sleep 300 & echo $! > child.pid; wait")
    start = time.monotonic()
    with pytest.raises(UnreachableError) as caught:
        vipu.list()
    took = time.monotonic() - start
    child = int((tmp_path / "child.pid").read_text(encoding="utf-8"))

    assert "vipu list partitions: no answer within 2 s" == caught.value.message
    assert took < 10  # killing only the shell would leave the pipe open until the child's 300 s end
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_an_error_message_with_escapes_is_shown_escaped(tmp_path):
    """The tool's failure message reaches the diagnostic with its control characters escaped."""
    vipu = tool(tmp_path, "printf 'partition p9 not found\\033]0;owned\\007\\n' >&2; exit 1")
    with pytest.raises(ProviderError) as caught:
        vipu.list()

    assert "partition p9 not found\\x1b]0;owned\\x07" == caught.value.message


def partition() -> plan.Partition:
    return plan.Partition(
        name="p64", allocation=None, server_host="127.0.0.1", server_port=8090, timeout_s=2, num_ipus=64,
        num_gcds=1, num_ilds=1, sync_type=None, ipu_link_routing_type=None, gw_link_routing_type=None,
        update=False, reset=False, remove=False, attempts=1, actions=())


@pytest.mark.parametrize(("listing", "code"), [
    ("yes", "PR510"),
    ("printf '\\377'", "PR510"),
    ("exec sleep 300", "PR501"),
])
def test_acquire_turns_a_misbehaving_tool_into_a_diagnostic(tmp_path, listing, code):
    """Through the partition step: a flood or garbage is PR510, a hang PR501."""
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(), tool(tmp_path, listing), owner="t")

    assert [code] == [d.code for d in caught.value.diagnostics]
    assert os.environ.get("PATH")  # (the stand-in's PATH was the provider's own, not the test's)
