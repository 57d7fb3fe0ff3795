"""The vipu adapter, against recorded ``vipu`` output (tests/data/vipu/, from reference section 6)."""

from collections.abc import Sequence
from pathlib import Path

import pytest

from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    NotFoundError,
    PartitionRequest,
    PartitionState,
    ProviderError,
    UnreachableError,
)
from poprun.partitions.vipu import VipuProvider, create_argv, error_of, parse_partition_table

DATA = Path(__file__).parents[1] / "data" / "vipu"


def recorded(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


class FakeVipu:
    """A runner that answers each vipu command with recorded output and records the commands."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], _timeout_s: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        words = " ".join(argv[5:])  # after: vipu --api-host H --api-port P
        for prefix, answer in self.answers.items():
            if words.startswith(prefix):
                return answer
        return 0, "", ""


def test_list_reads_the_seed_layout_with_cluster_first():
    """The PopRun guide's table (Cluster | Allocation | Partition ...) gives every row by column name."""
    parts = parse_partition_table(recorded("list-partitions-seed.txt"))

    assert ["part1", "part2", "part3"] == [p.name for p in parts]
    assert (32, 2, 2, "example", "DNC", "DEFAULT", PartitionState.PS_ACTIVE) == (
        parts[2].size, parts[2].num_gcds, parts[2].num_ilds, parts[2].allocation, parts[2].ipu_link_routing_type,
        parts[2].gw_link_routing_type, parts[2].state)


def test_list_reads_the_layout_with_dashed_rules():
    """The demo-in-a-box table (Partition first, rules of dashes) gives the one partition."""
    (p64,) = parse_partition_table(recorded("list-partitions-demo.txt"))

    assert ("p64", "c64_1-16", None, 64, 1, 1, "RINGSWNC") == (
        p64.name, p64.cluster, p64.allocation, p64.size, p64.num_gcds, p64.num_ilds, p64.ipu_link_routing_type)
    assert p64.reconfigurable is None


def test_list_of_an_empty_server_is_empty():
    """A table with only its header has no partitions."""
    assert () == parse_partition_table(recorded("list-partitions-demo.txt").splitlines()[0])


def test_get_completes_the_row_with_the_ipuof_configuration():
    """get = the list row plus replicas, sync type and reconfigurability from --ipuof-configs."""
    fake = FakeVipu({"list partitions": (0, recorded("list-partitions-demo.txt"), ""),
                     "get partition p64": (0, recorded("get-partition-ipuof-configs.json"), "")})
    vipu = VipuProvider("10.1.3.101", 8090, timeout_s=7, run=fake)

    info = vipu.get("p64")

    assert info is not None
    assert (1, "C2-COMPATIBLE", True, PartitionState.PS_ACTIVE) == (
        info.num_replicas, info.sync_type, info.reconfigurable, info.state)
    assert ["vipu", "--api-host", "10.1.3.101", "--api-port", "8090", "get", "partition", "p64", "--gcd", "0",
            "--ipuof-configs"] == fake.calls[-1]


def test_get_of_a_missing_partition_is_none():
    """A name not in the table is absent, without asking for its configuration."""
    fake = FakeVipu({"list partitions": (0, recorded("list-partitions-seed.txt"), "")})

    assert VipuProvider("h", 1, run=fake).get("nope") is None
    assert 1 == len(fake.calls)


def test_create_builds_the_documented_command_line():
    """create partition NAME --size N --num-gcds G, then the options that were given."""
    request = PartitionRequest(name="my_partition", size=32, num_gcds=2, num_ilds=2, allocation="allocation1",
                               sync_type="pod-native-default", ipu_link_routing_type="dnc")

    assert ["create", "partition", "my_partition", "--size", "32", "--num-gcds", "2", "--num-ilds", "2",
            "--allocation", "allocation1", "--sync-type", "pod-native-default", "--ipu-link-routing-type",
            "dnc"] == create_argv(request)


def test_create_asks_for_reconfigurable_only_when_requested():
    """--reconfigurable appears for a reconfigurable request (never one poprun makes itself)."""
    request = PartitionRequest(name="p", size=4, num_gcds=1, num_ilds=0, reconfigurable=True)

    assert ["create", "partition", "p", "--size", "4", "--num-gcds", "1", "--reconfigurable"] == create_argv(request)


def test_remove_and_reset_use_their_commands():
    """remove/reset partition NAME, against the given server."""
    fake = FakeVipu({"list partitions": (0, recorded("list-partitions-seed.txt"), "")})
    vipu = VipuProvider("vipu.my_domain", 34521, run=fake)

    vipu.remove("part1")
    vipu.reset("part2")

    assert [["remove", "partition", "part1"], ["reset", "partition", "part2"]] == [
        c[5:] for c in fake.calls if c[5] in ("remove", "reset")]


def test_the_recorded_connection_failure_means_unreachable():
    """The seed's 'unable to connect to VIRM/V-IPU Controller' is UnreachableError with its words."""
    fake = FakeVipu({"list partitions": (1, "", recorded("list-partitions-unreachable.stderr"))})

    with pytest.raises(UnreachableError) as caught:
        VipuProvider("localhost", 8090, run=fake).list()

    assert "unable to connect to VIRM/V-IPU Controller at context deadline exceeded" == caught.value.message


@pytest.mark.parametrize(("message", "kind"), [
    ("partition p1 already exists", ExistsError),
    ("partition p9 not found", NotFoundError),
    ("insufficient IPUs in allocation alloc-1", CapacityError),
    ("something else broke", ProviderError),
])
def test_error_messages_map_to_provider_errors(message, kind):
    """The tool's message words pick the error kind; anything else is a plain ProviderError."""
    assert kind is type(error_of(1, message))


def test_a_missing_tool_or_a_silent_server_is_unreachable():
    """OSError (no vipu) and a timeout both become UnreachableError."""
    def missing(argv, timeout_s):
        raise FileNotFoundError(2, "No such file or directory")

    def silent(argv, timeout_s):
        raise TimeoutError

    with pytest.raises(UnreachableError, match="cannot run vipu: No such file or directory"):
        VipuProvider("h", 1, run=missing).list()
    with pytest.raises(UnreachableError, match="no answer within 3 s"):
        VipuProvider("h", 1, timeout_s=3, run=silent).list()


@pytest.mark.parametrize("name", ["--force", "-h"])
def test_a_name_like_an_option_never_reaches_the_tool(name):
    """A partition name starting with '-' (from a saved plan or the server) is refused before any command runs."""
    fake = FakeVipu({"list partitions": (0, recorded("list-partitions-seed.txt").replace("part1", name.ljust(5)), "")})
    vipu = VipuProvider("h", 1, run=fake)

    for attempt in (lambda: vipu.remove(name), lambda: vipu.reset(name), lambda: vipu.get(name),
                    lambda: vipu.create(PartitionRequest(name=name, size=4, num_gcds=1, num_ilds=0))):
        with pytest.raises(ProviderError, match="starts with '-': the vipu tool would read it as an option"):
            attempt()

    assert [] == [c for c in fake.calls if name in c]
