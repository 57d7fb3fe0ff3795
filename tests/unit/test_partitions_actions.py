"""The partition rules of the seed (2.8, 2.10, changelogs 2.0-2.2), on an in-process emulated store."""

import time

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.partitions.actions import acquire, plan_actions, probe
from poprun.partitions.choice import provider_for
from poprun.partitions.provider import (
    EMULATOR_INVENTORY_ENV,
    PROVIDER_ENV,
    Owner,
    PartitionRequest,
    PartitionState,
)
from poprun.partitions.store import Inventory, Seed, Store
from poprun.planner import plan


def partition(**changes: object) -> plan.Partition:
    """A plan's partition section: 16 IPUs, 2 GCDs, one ILD, the plan's defaults."""
    base = plan.Partition(
        name="p16", allocation=None, server_host="127.0.0.1", server_port=8090, timeout_s=5, num_ipus=16,
        num_gcds=2, num_ilds=1, sync_type=None, ipu_link_routing_type=None, gw_link_routing_type=None,
        update=False, reset=None, remove=True, attempts=1, actions=("as planned",))
    return evolve(base, **changes)


def request(name: str = "p16", size: int = 16, gcds: int = 2, **more: object) -> PartitionRequest:
    return PartitionRequest(name=name, size=size, num_gcds=gcds, num_ilds=0, **more)  # type: ignore[arg-type]


@pytest.fixture
def store() -> Store:
    return Store(":memory:", Inventory(ipus=64, ild_size=16), address="127.0.0.1:8090")


def codes(exc: pytest.ExceptionInfo[DiagnosticError]) -> list[str]:
    return [d.code for d in exc.value.diagnostics]


def test_create_use_and_remove_at_exit(store):
    """update=yes creates a missing partition, leases it, and removes it at exit."""
    with acquire(partition(update=True), store, owner="t") as lease:
        info = store.get("p16")

        assert info is not None
        assert (True, "p16", False, PartitionState.PS_ACTIVE) == (lease.created, lease.name, info.reconfigurable,
                                                                   info.state)
        assert lease.env["IPUOF_VIPU_API_PARTITION_ID"] == "p16"

    assert () == store.list()


def test_remove_no_keeps_what_poprun_created(store):
    """--remove-partition=no keeps the partition at exit, and frees its lease."""
    with acquire(partition(update=True, remove=False), store, owner="t"):
        pass
    info = store.get("p16")

    assert info is not None
    assert info.leased_by is None


def test_an_existing_partition_is_used_and_kept(store):
    """A matching partition that poprun did not create is used and never removed."""
    store.create(request())
    with acquire(partition(), store, owner="t") as lease:
        assert lease.created is False

    assert ["p16"] == [p.name for p in store.list()]


def test_a_missing_partition_without_update_lists_those_that_exist(store):
    """PR500 names the missing partition and lists the others."""
    store.create(request("other", 4, 1))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(), store, owner="t")

    assert ["PR500"] == codes(caught)
    assert "has no partition 'p16'; it has other (4 IPUs, 1 GCD, PS_ACTIVE)" in caught.value.diagnostics[0].detail


def test_the_only_partition_is_used_when_none_is_named(store):
    """No name and one partition: that one."""
    store.create(request("solo"))
    with acquire(partition(name=None), store, owner="t") as lease:
        assert "solo" == lease.name


def test_several_partitions_need_a_name(store):
    """No name and several partitions: PR503."""
    store.create(request("a", 4, 1))
    store.create(request("b", 4, 1))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(name=None), store, owner="t")

    assert ["PR503"] == codes(caught)


def test_a_mismatch_is_an_error_without_update_and_frees_the_lease(store):
    """Size, GCDs and sync type are checked (changelog 2.2); the error leaves no lease behind."""
    store.create(request(size=8, gcds=1, sync_type="c2-compatible"))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(sync_type="pod-native-default"), store, owner="t")
    info = store.get("p16")

    assert ["PR504"] == codes(caught)
    assert ("8 IPUs, the launch needs 16; 1 GCD, the launch needs 2; 1 replica, the launch needs 2; "
            "sync type C2-COMPATIBLE, the launch needs POD-NATIVE-DEFAULT") == caught.value.diagnostics[0].detail
    assert info is not None
    assert info.leased_by is None


def test_update_recreates_a_mismatch_and_removes_it_at_exit(store):
    """--update-partition=yes removes and creates the partition under its name; poprun made it, so it goes."""
    store.create(request(size=8, gcds=1))
    with acquire(partition(update=True), store, owner="t") as lease:
        info = store.get("p16")

        assert info is not None
        assert ("update", 16, 2) == (lease.decision.action, info.size, info.num_gcds)

    assert () == store.list()


def test_a_reconfigurable_partition_is_checked_for_size_only_and_not_reset(store):
    """Reconfigurable: large enough is enough; by default it is not reset."""
    store.create(request(size=32, gcds=1, reconfigurable=True))
    with acquire(partition(), store, owner="t") as lease:
        assert (False, "use") == (lease.decision.reset, lease.decision.action)


def test_reset_defaults_follow_reconfigurability(store):
    """Non-reconfigurable: reset by default; --reset-partition=no keeps it as it is."""
    store.create(request())
    with acquire(partition(), store, owner="t") as lease:
        assert lease.decision.reset is True
    with acquire(partition(reset=False), store, owner="t") as lease:
        assert lease.decision.reset is False


def test_a_partition_leased_by_a_live_launch_is_in_use(store):
    """PR506 names the holder; the partition stays with it."""
    store.create(request(), owner=Owner(label="other", host="pod7", pid=1))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(), store, owner="t")

    assert ["PR506"] == codes(caught)
    assert "its devices are leased by another launch (other@pod7:1)" == caught.value.diagnostics[0].detail


def test_a_lease_past_its_time_is_free(store):
    """A lease that was not renewed within its time to live no longer holds the partition."""
    store.create(request(), owner=Owner(label="gone", host="pod7", pid=1), ttl_s=0.01)
    time.sleep(0.05)
    with acquire(partition(), store, owner="t") as lease:
        assert "p16" == lease.name


def test_not_enough_ipus_in_the_allocation(store):
    """PR505 when the inventory cannot hold the partition; nothing is left behind."""
    store.create(request("big", 64, 1))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(update=True), store, owner="t")

    assert ["PR505"] == codes(caught)
    assert ["big"] == [p.name for p in store.list()]


def test_an_exception_in_the_launch_still_removes_the_partition(store):
    """Every exit path releases: an exception inside the with block too."""
    with pytest.raises(RuntimeError), acquire(partition(update=True), store, owner="t"):
        raise RuntimeError

    assert () == store.list()


class Flaky:
    """A store whose reset (or create) leaves the partition in PS_ERROR the first ``failures`` times."""

    def __init__(self, store: Store, failures: int) -> None:
        self.store, self.failures, self.calls = store, failures, 0
        self.address = store.address

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def reset(self, name: str) -> object:
        self.calls += 1
        info = self.store.reset(name)
        return evolve(info, state=PartitionState.PS_ERROR) if self.calls <= self.failures else info


def test_a_failed_reset_is_tried_again_up_to_the_attempts(store):
    """--vipu-partition-attempts=2: a reset that ends in PS_ERROR once is tried again and succeeds."""
    store.create(request())
    flaky = Flaky(store, failures=1)
    with acquire(partition(attempts=2), flaky, owner="t") as lease:  # type: ignore[arg-type]
        assert (2, PartitionState.PS_ACTIVE) == (flaky.calls, lease.info.state)


def test_a_reset_that_keeps_failing_is_pr507(store):
    """After every attempt the state is not PS_ACTIVE: PR507, and the lease is given back."""
    store.create(request())
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(attempts=3), Flaky(store, failures=5), owner="t")  # type: ignore[arg-type]
    info = store.get("p16")

    assert ["PR507"] == codes(caught)
    assert "after reset it is in state PS_ERROR, not PS_ACTIVE (3 attempts)" == caught.value.diagnostics[0].detail
    assert info is not None
    assert info.leased_by is None


def test_a_pending_partition_is_polled_until_active(store):
    """A partition in PS_PENDING is polled (without real sleeping here) until it settles."""
    store.create(request(), state=PartitionState.PS_PENDING)
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        store.reset("p16")

    with acquire(partition(reset=False), store, owner="t", sleep=nap) as lease:
        assert (PartitionState.PS_ACTIVE, [0.05]) == (lease.info.state, naps)


def test_an_injected_create_error_is_pr507_and_removed(tmp_path):
    """A partition created into PS_ERROR is not kept: PR507, and it is removed."""
    store = Store(":memory:", Inventory(faults=(("p16", "create-error"),)))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(update=True), store, owner="t")

    assert ["PR507"] == codes(caught)
    assert () == store.list()


def test_a_failed_removal_at_exit_is_a_warning(store):
    """PR508 in lease.warnings, never an exception, when the removal at exit fails."""
    failing = Store(":memory:", Inventory(faults=(("p16", "remove-refused"),)))
    with acquire(partition(update=True), failing, owner="t") as lease:
        pass

    assert ["PR508"] == [w.code for w in lease.warnings]


def test_probe_of_a_closed_port_is_quick_and_unreachable():
    """The planning probe answers within 0.5 s with PR502 and marks the actions for apply time."""
    part = partition(server_port=9)
    start = time.monotonic()
    seen = probe(part, {PROVIDER_ENV: "emulated"})
    took = time.monotonic() - start
    actions, diags = plan_actions(part, seen)

    assert took < 0.6
    assert (False, ["PR502"]) == (seen.reachable, [d.code for d in diags])
    assert ("decided at apply time: the V-IPU server at 127.0.0.1:9 did not answer while planning",
            "as planned") == actions


def test_plan_actions_of_a_reachable_server(store):
    """With the server's partitions, planning decides the actions as apply would."""
    store.create(request())
    actions, diags = plan_actions(partition(), probe(partition(), {}, provider=store))

    assert () == diags
    assert ("use partition p16 (16 IPUs, 2 GCDs, PS_ACTIVE)", "reset it before running",
            "keep it at exit (poprun did not create it)") == actions


def test_provider_for_picks_the_in_process_store_from_an_inventory_file(tmp_path):
    """POPRUN_VIPU_EMULATOR_INVENTORY makes an in-process emulated service seeded from JSON."""
    (tmp_path / "pod.json").write_text('{"ipus": 16, "ild_size": 16, "partitions": [{"name": "x", "size": 4}]}',
                                       encoding="utf-8")
    chosen = provider_for(partition(), {PROVIDER_ENV: "emulated", EMULATOR_INVENTORY_ENV: str(tmp_path / "pod.json"),
                                        "PATH": str(tmp_path)})

    assert isinstance(chosen, Store)
    assert ["x"] == [p.name for p in chosen.list()]


def test_provider_for_picks_vipu_when_the_tool_is_on_path(tmp_path):
    """With no choice made, an executable 'vipu' on PATH selects the vipu adapter."""
    tool = tmp_path / "vipu"
    tool.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    tool.chmod(0o755)

    assert "VipuProvider" == type(provider_for(partition(), {"PATH": str(tmp_path)})).__name__
    assert "EmulatedProvider" == type(provider_for(partition(), {"PATH": str(tmp_path),
                                                                 PROVIDER_ENV: "emulated"})).__name__


def test_seeds_may_start_leased():
    """An inventory's seed partition may be leased by another launch (for tests of a busy Pod)."""
    seed = Seed(request=request(), leased_by=Owner(label="x", host="pod7", pid=9))
    store = Store(":memory:", Inventory(seeds=(seed,)))
    info = store.get("p16")

    assert info is not None
    assert "x@pod7:9" == info.leased_by
