"""
Accelerators in a host's topology: sysfs under a fake root, nvidia-smi's recorded outputs, the probe's script.

The fake trees are written from real layouts (an HGX H100 8-GPU server: the bus ids of
poprun/topologies/hgx-h100-8gpu-2x-xeon-8480.json, with the devices a real one also has beside
its GPUs: NVSwitches, a BMC's VGA, a NIC, a GPU's audio function). GPUs cannot exist here: sysfs
is read from a directory and nvidia-smi is a script printing a recorded output (tests/data/devices).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from poprun.planner.machine import (
    DUMP_SCRIPT,
    Device,
    DeviceNote,
    HostTopology,
    NumaNode,
    attribute,
    bus_id,
    discover_devices,
    from_dump,
    load,
    merge_smi,
    parse_smi,
    run_smi,
    sysfs_devices,
    to_json,
)

DATA = Path(__file__).parent.parent / "data" / "devices"
HGX_GPUS = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")
# Beside the GPUs: four NVSwitches (bridge class), the BMC's VGA (ASPEED), a ConnectX NIC, an audio function.
OTHERS = (("0000:05:00.0", "0x068000", "0x10de", "0x22a3"), ("0000:03:00.0", "0x030000", "0x1a03", "0x2000"),
          ("0000:29:00.0", "0x020000", "0x15b3", "0x1021"), ("0000:1b:00.1", "0x040300", "0x10de", "0x22ba"))


def hgx_root(root: Path, *, numa: dict[str, str] | None = None) -> Path:
    """Write an HGX H100 server's PCI devices and two NUMA nodes' CPU lists under ``root``; return it."""
    for n, cpus in ((0, "0-55,112-167"), (1, "56-111,168-223")):
        node = root / f"sys/devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
    for k, address in enumerate(HGX_GPUS):
        pci_device(root, address, "0x030200", "0x10de", "0x2330", (numa or {}).get(address, str(k // 4)),
                   "0-55,112-167" if k < 4 else "56-111,168-223")
    for address, class_, vendor, device in OTHERS:
        pci_device(root, address, class_, vendor, device, "0", "0-55,112-167")
    return root


def pci_device(root: Path, address: str, class_: str, vendor: str, device: str, numa: str, local: str) -> Path:  # noqa: PLR0917 - the attributes, in sysfs order
    """Write one PCI device's sysfs attributes under ``root``."""
    where = root / "sys/bus/pci/devices" / address
    where.mkdir(parents=True)
    for name, value in (("class", class_), ("vendor", vendor), ("device", device), ("numa_node", numa),
                        ("local_cpulist", local)):
        (where / name).write_text(value + "\n")
    return where


def two_nodes() -> HostTopology:
    """The CPUs of the HGX server (two Xeon 8480+, 56 cores, two threads each)."""
    return load("hgx-h100-8gpu-2x-xeon-8480")


def test_sysfs_lists_the_gpus_in_bus_order_with_their_numa_nodes(tmp_path: Path) -> None:
    """Only NVIDIA/AMD display, 3D and accelerator classes count: no NVSwitch, BMC VGA, NIC or audio function."""
    devices = sysfs_devices(str(hgx_root(tmp_path)))

    assert [(d.index, d.bus_id, d.numa_node, d.vendor, d.pci_id) for d in devices] == [
        (k, address, k // 4, "nvidia", "10de:2330") for k, address in enumerate(HGX_GPUS)]


def test_an_unknown_numa_node_is_the_node_whose_cpus_the_device_lists(tmp_path: Path) -> None:
    """numa_node -1 (firmware without _PXM): the node whose cpulist is the device's local_cpulist."""
    root = hgx_root(tmp_path, numa={HGX_GPUS[5]: "-1", HGX_GPUS[1]: "-1"})
    nodes = {n.index: n.cpus for n in two_nodes().numa_nodes}

    assert [0, 0, 0, 0, 1, 1, 1, 1] == [d.numa_node for d in sysfs_devices(str(root), nodes)]
    assert -1 == sysfs_devices(str(root))[5].numa_node  # without the nodes: not known


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "garbage", "nul", "directory", "missing"])
def test_a_numa_node_that_is_not_an_attribute_is_unknown_and_never_waited_on(tmp_path: Path, kind: str) -> None:
    """A FIFO, a link to /dev/zero, a 1 MiB file, garbage, a NUL, a directory or nothing: -1 at once (then local_cpulist)."""
    root = hgx_root(tmp_path)
    target = root / "sys/bus/pci/devices" / HGX_GPUS[6] / "numa_node"
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    elif kind == "huge":
        target.write_text("1" * (1 << 20))
    elif kind == "garbage":
        target.write_text("$(reboot)\n")
    elif kind == "nul":
        target.write_bytes(b"1\0\n")
    elif kind == "directory":
        target.mkdir()
    started = time.monotonic()

    plain = sysfs_devices(str(root))
    near = sysfs_devices(str(root), {n.index: n.cpus for n in two_nodes().numa_nodes})

    assert time.monotonic() - started < 30
    assert (-1, 1) == (plain[6].numa_node, near[6].numa_node)
    assert len(plain) == len(HGX_GPUS)


def test_attribute_reads_small_regular_files_only(tmp_path: Path) -> None:
    """The bounded reader: text of a regular file; None for a FIFO, a device, an oversized file, non-ASCII."""
    (tmp_path / "ok").write_text(" 0x10de\n")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "big").write_text("x" * 5000)
    (tmp_path / "utf").write_bytes("é".encode())

    assert ("0x10de", None, None, None, None) == (attribute(str(tmp_path / "ok")), attribute(str(tmp_path / "fifo")),
                                                  attribute(str(tmp_path / "big")), attribute(str(tmp_path / "utf")),
                                                  attribute("/dev/zero"))


def test_amd_accelerators_are_numbered_apart_from_nvidia(tmp_path: Path) -> None:
    """MI250 GCDs (class 0x0380) and an MI300X (class 0x1200) are AMD's devices 0-2; an NVIDIA GPU is NVIDIA's 0."""
    pci_device(tmp_path, "0000:c1:00.0", "0x038000", "0x1002", "0x740c", "1", "")
    pci_device(tmp_path, "0000:29:00.0", "0x038000", "0x1002", "0x740c", "0", "")
    pci_device(tmp_path, "0000:0c:00.0", "0x120000", "0x1002", "0x74a1", "0", "")
    pci_device(tmp_path, "0000:85:00.0", "0x030000", "0x10de", "0x20b5", "1", "")

    found = sysfs_devices(str(tmp_path))

    assert [("amd", 0, "0000:0c:00.0"), ("amd", 1, "0000:29:00.0"), ("nvidia", 0, "0000:85:00.0"),
            ("amd", 2, "0000:c1:00.0")] == [(d.vendor, d.index, d.bus_id) for d in found]


def test_bus_ids_read_as_sysfs_writes_them() -> None:
    """nvidia-smi's eight-digit capital domain and sysfs's four-digit one are the same address; others are not one."""
    assert ("0000:1b:00.0", "0000:1b:00.0", None, None) == (
        bus_id("00000000:1B:00.0"), bus_id("0000:1b:00.0"), bus_id("1b:00.0"), bus_id("0000:1b:00.0; rm -rf /"))


def test_the_recorded_nvidia_smi_output_parses_to_its_rows() -> None:
    """Every row of a real HGX H100's answer, in its order; a line that is not a row is counted, not taken."""
    text = (DATA / "nvidia-smi-hgx-h100.csv").read_text()

    rows, bad = parse_smi(text + "No devices were found\n")

    assert (8, 1) == (len(rows), bad)
    assert (0, "0000:1b:00.0", "NVIDIA H100 80GB HBM3") == (rows[0][0], rows[0][1], rows[0][3])
    assert [r[1] for r in rows] == list(HGX_GPUS)
    assert ((), 1) == parse_smi((DATA / "nvidia-smi-failed.txt").read_text())


def test_a_hostile_answer_gives_no_control_character_and_no_odd_uuid() -> None:
    """An escape sequence in a name is dropped; a UUID with a space or a quote, or an index of 40 digits, is no row."""
    rows, bad = parse_smi("0, 00000000:1B:00.0, GPU-1a2b, NVIDIA \x1b[31mH100\x07\n"
                          "1, 00000000:43:00.0, GPU-1 $(id), NVIDIA H100\n" + "9" * 40 + ", 00000000:52:00.0, GPU-3, x\n")

    assert ([(0, "0000:1b:00.0", "GPU-1a2b", "NVIDIA [31mH100")], 2) == (list(rows), bad)


def test_an_index_of_other_digits_is_no_row_and_no_exception() -> None:
    """'\u00b2' and '\u0663' are digits to str.isdigit(): int() raised on the first (a traceback from a host's answer)."""
    assert ((), 2) == parse_smi("\u00b2, 00000000:1B:00.0, GPU-1, H100\n\u0663, 00000000:43:00.0, GPU-2, H100\n")


PROBED = "node 0 0-3\ncpu 0 0 0\ncpu 1 0 1\ncpu 2 0 2\ncpu 3 0 3\n"
PCI = "pci 0000:{bus}:00.0 0x10de 0x030200 0x2330 0 -\n"


def test_a_probe_answer_that_repeats_a_device_gives_it_once() -> None:
    """A forged answer names one bus id three times: one device (two would be given to two instances as one)."""
    topology = from_dump("h", PROBED + PCI.format(bus="1b") * 3 + PCI.format(bus="2b"))

    assert [(0, "0000:1b:00.0"), (1, "0000:2b:00.0")] == [(d.index, d.bus_id) for d in topology.devices]


@pytest.mark.parametrize("repeat", ["smi 0, 00000000:2B:00.0, GPU-b, H100", "smi 1, 00000000:1B:00.0, GPU-b, H100"])
def test_an_nvidia_smi_row_that_repeats_an_index_or_a_bus_id_is_left_out(repeat: str) -> None:
    """Each index and bus id once, whatever nvidia-smi's answer says; the repeated row is a PR248 note."""
    smi = f"smi 0, 00000000:1B:00.0, GPU-a, H100\n{repeat}\nsmi exit 0\n"

    topology = from_dump("h", PROBED + PCI.format(bus="1b") + PCI.format(bus="2b") + smi)

    indices, buses = [d.index for d in topology.devices], [d.bus_id for d in topology.devices]
    assert (len(set(indices)), len(set(buses))) == (len(indices), len(buses))
    assert "again: the row is left out" in topology.device_notes[0].detail


def test_nvidia_smi_merged_with_sysfs_gives_names_and_uuids(tmp_path: Path) -> None:
    """Agreeing views: sysfs's NUMA nodes, nvidia-smi's names and UUIDs, no note."""
    rows, _ = parse_smi((DATA / "nvidia-smi-hgx-h100.csv").read_text())

    devices, notes = merge_smi(sysfs_devices(str(hgx_root(tmp_path))), rows)

    assert () == notes
    assert [(k, k // 4, "NVIDIA H100 80GB HBM3") for k in range(8)] == [(d.index, d.numa_node, d.name) for d in devices]
    assert all(d.uuid.startswith("GPU-") for d in devices)


def test_a_container_that_shows_one_gpu_is_that_gpu_numbered_zero_with_a_note(tmp_path: Path) -> None:
    """sysfs shows the host's 8; nvidia-smi (CUDA) the container's one: that one, as CUDA numbers it, and PR248."""
    rows, _ = parse_smi("0, 00000000:9D:00.0, GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9, NVIDIA H100 80GB HBM3\n")

    devices, notes = merge_smi(sysfs_devices(str(hgx_root(tmp_path))), rows)

    assert [Device(index=0, vendor="nvidia", bus_id="0000:9d:00.0", numa_node=1, name="NVIDIA H100 80GB HBM3",
                   uuid="GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9", pci_id="10de:2330")] == list(devices)
    assert ["PR248", "PR248"] == [n.code for n in notes]
    assert "numbers the GPU at 0000:9d:00.0 0, sysfs's bus order 4" in notes[0].detail
    assert "does not show (0000:1b:00.0, " in notes[1].detail


def fake_smi(folder: Path, body: str) -> Path:
    """Write an executable nvidia-smi in ``folder`` that runs ``body`` (sh); return the folder."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body + "\n")
    smi.chmod(0o755)
    return folder


def test_discovery_runs_nvidia_smi_and_merges_its_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A (recorded) nvidia-smi on PATH: source sysfs+nvidia-smi, names from it."""
    bin_ = fake_smi(tmp_path / "bin", f"cat '{DATA / 'nvidia-smi-hgx-h100.csv'}'")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")

    found = discover_devices(two_nodes(), str(hgx_root(tmp_path / "root")), smi=True)

    assert ("sysfs+nvidia-smi", (), "NVIDIA H100 80GB HBM3") == (found.device_source, found.device_notes,
                                                                   found.devices[7].name)


def test_a_failing_nvidia_smi_is_a_note_and_sysfs_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 9 with the driver message: PR247 naming it; the devices are sysfs's."""
    bin_ = fake_smi(tmp_path / "bin", f"cat '{DATA / 'nvidia-smi-failed.txt'}'; exit 9")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")

    found = discover_devices(two_nodes(), str(hgx_root(tmp_path / "root")), smi=True)

    assert ("sysfs", 8) == (found.device_source, len(found.devices))
    assert [DeviceNote("PR247", "nvidia-smi exited with 9: NVIDIA-SMI has failed because it couldn't communicate with "
                                "the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.")
            ] == list(found.device_notes)


def test_a_hung_nvidia_smi_is_given_up_after_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi that never answers: PR247 once the timeout passes, not a hang."""
    bin_ = fake_smi(tmp_path / "bin", "exec sleep 600")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")

    text, note = run_smi(timeout_s=1)

    assert (None, DeviceNote("PR247", "nvidia-smi gave no answer within 1 s")) == (text, note)


def test_an_nvidia_smi_that_writes_without_end_is_cut_at_one_mib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """64 MiB of rows: PR247 at 1 MiB (the whole answer was read into memory before, then cut)."""
    bin_ = fake_smi(tmp_path / "bin", "yes '0, 00000000:1B:00.0, GPU-1, H100' | head -c 67108864")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")

    assert (None, DeviceNote("PR247", "nvidia-smi wrote more than 1 MiB")) == run_smi(timeout_s=60)


def test_a_hung_nvidia_smi_leaves_no_child_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that holds the output (and ignores SIGTERM) is killed with it, once the timeout passes."""
    pid_file = tmp_path / "child"
    bin_ = fake_smi(tmp_path / "bin", f"sh -c 'trap \"\" TERM; echo $$ > {pid_file}; exec sleep 600' & wait")
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")

    assert (None, DeviceNote("PR247", "nvidia-smi gave no answer within 1 s")) == run_smi(timeout_s=1)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_no_nvidia_smi_is_no_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-smi on PATH (an AMD host, a CPU host): nothing to say."""
    monkeypatch.setenv("PATH", str(tmp_path))

    assert (None, None) == run_smi()


def test_the_probe_script_run_for_real_on_a_fake_root_reads_what_sysfs_does(tmp_path: Path) -> None:
    """DUMP_SCRIPT with the root as its argument (the product passes '/'): the same devices, a FIFO skipped."""
    root = hgx_root(tmp_path / "root")
    (root / "sys/bus/pci/devices" / HGX_GPUS[2] / "numa_node").unlink()
    os.mkfifo(root / "sys/bus/pci/devices" / HGX_GPUS[2] / "numa_node")
    (root / "sys/devices/system/cpu/cpu0/topology").mkdir(parents=True)
    (root / "sys/devices/system/cpu/cpu0/topology/core_id").write_text("0\n")
    (root / "sys/devices/system/cpu/cpu0/topology/physical_package_id").write_text("0\n")

    out = subprocess.run(["sh", "-c", DUMP_SCRIPT, "sh", str(root)], capture_output=True, text=True, check=False,
                         timeout=60).stdout
    dumped = from_dump("h1", out)

    assert [(d.index, d.bus_id, d.numa_node) for d in dumped.devices] == [
        (k, a, k // 4) for k, a in enumerate(HGX_GPUS)]  # the FIFO's GPU: its node from its local_cpulist
    assert ("probe", ()) == (dumped.device_source, dumped.device_notes)


def test_a_forged_probe_answer_gives_no_device_it_cannot_name() -> None:
    """Lines a hostile host prints: no bus id, a shell word, too many words, an smi row that is not one: skipped."""
    text = ("cpu 0 0 0\npci 0000:1b:00.0 0x10de 0x030200 0x2330 0 0-3\npci $(reboot) 0x10de 0x030200 - 0 -\n"
            "pci 0000:43:00.0 0x10de 0x030200 0x2330 0 0-3 extra\npci 0000:52:00.0 0x8086 0x030000 - 0 -\n"
            "smi 0, nonsense\nsmi exit 0\n")

    dumped = from_dump("h1", text)

    assert [("0000:1b:00.0", "")] == [(d.bus_id, d.name) for d in dumped.devices]
    assert [DeviceNote("PR247", "nvidia-smi's answer has no row poprun can read")] == list(dumped.device_notes)


def test_a_probe_where_nvidia_smi_failed_carries_the_note() -> None:
    """The host's nvidia-smi exited 124 (timeout(1)): PR247 'no answer within 10 s'."""
    dumped = from_dump("h1", "cpu 0 0 0\npci 0000:1b:00.0 0x10de 0x030200 0x2330 0 -\nsmi exit 124\n")

    assert [DeviceNote("PR247", "nvidia-smi no answer within 10 s")] == list(dumped.device_notes)


def test_topology_files_keep_devices_and_notes(tmp_path: Path) -> None:
    """to_json writes the devices and notes that load reads back (source: recorded)."""
    topology = HostTopology(name="t", numa_nodes=(NumaNode(0, 0, ((0,),)),),
                            devices=(Device(index=0, vendor="nvidia", bus_id="0000:1b:00.0", numa_node=0, name="n",
                                            uuid="GPU-1", pci_id="10de:2330"),),
                            device_source="sysfs+nvidia-smi", device_notes=(DeviceNote("PR248", "d"),))
    (tmp_path / "t.json").write_text(to_json(topology))

    loaded = load(str(tmp_path / "t.json"))

    assert (topology.devices, topology.device_notes, "recorded") == (loaded.devices, loaded.device_notes,
                                                                     loaded.device_source)


@pytest.mark.parametrize("device", [{"index": 0, "vendor": "intel", "bus_id": "0000:1b:00.0", "numa_node": 0},
                                    {"index": -1, "vendor": "nvidia", "bus_id": "0000:1b:00.0", "numa_node": 0},
                                    {"index": 0, "vendor": "nvidia", "bus_id": "$(id)", "numa_node": 0},
                                    {"index": 0, "vendor": "nvidia", "bus_id": "0000:1b:00.0"}])
def test_a_bad_device_in_a_topology_file_is_a_one_line_value_error(tmp_path: Path, device: dict) -> None:
    """A vendor not known, a negative index, a bus id that is not one, a missing key: ValueError naming the file."""
    import json

    (tmp_path / "t.json").write_text(json.dumps({"numa_nodes": [{"index": 0, "socket": 0, "cores": [[0]]}],
                                                 "devices": [device]}))
    with pytest.raises(ValueError, match="is not a host topology"):
        load(str(tmp_path / "t.json"))


def test_the_recorded_gpu_servers() -> None:
    """HGX H100: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1; R750xa: 4 A100, two a socket, CPUs numbered round robin."""
    hgx, dell = load("hgx-h100-8gpu-2x-xeon-8480"), load("dell-r750xa-4x-a100")

    assert [0, 0, 0, 0, 1, 1, 1, 1] == [d.numa_node for d in hgx.devices]
    assert (224, 112) == (sum(len(n.cpus) for n in hgx.numa_nodes), len(hgx.numa_nodes[0].cpus))
    assert ([0, 0, 1, 1], (0, 2, 4)) == ([d.numa_node for d in dell.devices], dell.numa_nodes[0].cpus[:3])
