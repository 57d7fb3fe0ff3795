"""
The device checks that need a GPU: run on a machine with one, ``python3 bench/gpu_check.py``.

Run from the repository (after installing it; torch with CUDA for checks 2 and 4). Without an
NVIDIA GPU (none in sysfs, no working ``nvidia-smi``) it says so and exits 0: nothing to check.
Otherwise it prints each check and its verdict, and exits 1 when one fails:

1. Discovery: sysfs's devices (``/sys/bus/pci/devices``: bus id, NUMA node) against
   ``nvidia-smi``'s (``--query-gpu=index,pci.bus_id,uuid,name`` and the NUMA affinity column of
   ``nvidia-smi topo -m``): the same GPUs, numbers and NUMA nodes.
2. One instance of one device: ``poprun --devices-per-instance 1 --num-instances 1`` runs an
   instance that prints ``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK``, ``torch.cuda.get_device_name(0)``,
   torch's PCI bus id of ``cuda:0`` and its CPU affinity; checked against the plan (``poprun plan
   --format json``): the planned device's bus id is torch's, and the CPUs are its NUMA node's
   (as far as this process may use them).
3. ``--devices-per-instance N+1`` on a host of N GPUs: PR241 and status 2, nothing started.
4. A one-instance DDP training step with the ``nccl`` backend under poprun (world size 1).

The output is what an issue's closing note quotes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from poprun.planner.machine import (  # noqa: E402 - after the repository is on the path
    discover,
    parse_smi,
    run_smi,
    sysfs_devices,
)

PROBE = r"""
import json, os, sys
out = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
       "POPDIST_DEVICES": os.environ.get("POPDIST_DEVICES"), "affinity": sorted(os.sched_getaffinity(0))}
try:
    import torch
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["name"] = torch.cuda.get_device_name(0)
        out["count"] = torch.cuda.device_count()
        if hasattr(p, "pci_bus_id"):
            out["bus_id"] = "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id, p.pci_device_id)
    else:
        out["torch"] = "torch without CUDA"
except ImportError as exc:
    out["torch"] = f"no torch: {exc}"
print("GPUCHECK " + json.dumps(out))
"""

DDP = r"""
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("nccl")
device = torch.device("cuda", 0)
torch.cuda.set_device(device)
model = DistributedDataParallel(torch.nn.Linear(16, 4).to(device), device_ids=[device])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 16, device=device)
loss = model(x).pow(2).mean()
loss.backward()
optimizer.step()
total = torch.ones(1, device=device)
dist.all_reduce(total)
torch.cuda.synchronize()
print(f"GPUCHECK ddp ok: world size {dist.get_world_size()}, backend {dist.get_backend()}, loss {loss.item():.4f}, "
      f"all_reduce {total.item():.0f}")
dist.destroy_process_group()
"""

FAILED: list[str] = []


def verdict(name: str, ok: bool, detail: str = "") -> None:
    """Print one check's verdict; remember a failure."""
    print(f"  [{'ok' if ok else 'FAILED'}] {name}" + (f": {detail}" if detail else ""))
    if not ok:
        FAILED.append(name)


def poprun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run this checkout's poprun with ``args``."""
    env = {k: v for k, v in os.environ.items() if k != "POPRUN_HOST_TOPOLOGY"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False, cwd=tempfile.gettempdir())


def smi_numa() -> dict[int, str]:
    """Return nvidia-smi's NUMA affinity per GPU index (``nvidia-smi topo -m``), {} when it cannot say."""
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30,
                              check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_topo(text)


def parse_topo(text: str) -> dict[int, str]:
    """Return the NUMA Affinity column of ``nvidia-smi topo -m``'s text (tab-separated) per GPU index."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split("\t") for line in lines if "NUMA Affinity" in line), None)
    if header is None:
        return {}
    column = [cell.strip() for cell in header].index("NUMA Affinity")
    found = {}
    for line in lines:
        cells = [cell.strip() for cell in line.split("\t")]
        if cells[0].startswith("GPU") and cells[0][3:].isdigit() and len(cells) > column:
            found[int(cells[0][3:])] = cells[column]
    return found


def check_discovery() -> tuple[list, dict[int, tuple[int, ...]]]:
    """Check 1; return sysfs's NVIDIA devices and the NUMA nodes' CPUs."""
    topology = discover()
    nodes = {n.index: n.cpus for n in topology.numa_nodes}
    devices = [d for d in sysfs_devices("/", nodes) if d.vendor == "nvidia"]
    text, note = run_smi()
    rows = parse_smi(text)[0] if text is not None else ()
    print("1. discovery: sysfs against nvidia-smi")
    if note is not None:
        print(f"  nvidia-smi: {note.code} {note.detail}")
    numa = smi_numa()
    by_bus = {r[1]: r for r in rows}
    print(f"  {'bus id':14} {'sysfs #':8} {'sysfs NUMA':11} {'smi #':6} {'smi NUMA':9} name")
    for d in devices:
        row = by_bus.get(d.bus_id)
        print(f"  {d.bus_id:14} {d.index:<8} {d.numa_node:<11} {row[0] if row else '-':<6} "
              f"{numa.get(row[0], '-') if row else '-':<9} {row[3] if row else ''}")
    verdict("the same GPUs", {d.bus_id for d in devices} == set(by_bus),
            f"sysfs {len(devices)}, nvidia-smi {len(rows)}")
    verdict("the same numbers", all(by_bus[d.bus_id][0] == d.index for d in devices if d.bus_id in by_bus))
    if numa:
        agree = all(str(d.numa_node) == numa.get(by_bus[d.bus_id][0], "N/A") or
                    (d.numa_node < 0 and numa.get(by_bus[d.bus_id][0]) == "N/A")
                    for d in devices if d.bus_id in by_bus)
        verdict("the same NUMA nodes", agree)
    else:
        print("  (nvidia-smi topo -m gives no NUMA affinity column: NUMA nodes not compared)")
    return devices, nodes


def check_one_instance(nodes: dict[int, tuple[int, ...]]) -> None:
    """Check 2: the plan's device and CPUs are what the instance sees."""
    print("2. poprun --devices-per-instance 1 --num-instances 1")
    plan = poprun("plan", "--format", "json", "--devices-per-instance", "1", "--num-instances", "1",
                  sys.executable, "-c", PROBE)
    if plan.returncode != 0:
        verdict("planned", ok=False, detail=plan.stderr.strip())
        return
    data = json.loads(plan.stdout)
    instance = data["instances"][0]
    device = next(d for h in data["devices"]["hosts"] for d in h["devices"] if str(d["index"]) == instance["devices"][0])
    ran = poprun("--devices-per-instance", "1", "--num-instances", "1", sys.executable, "-c", PROBE)
    seen = next((json.loads(line.split("GPUCHECK ", 1)[1]) for line in ran.stdout.splitlines()
                 if "GPUCHECK " in line), None)
    if ran.returncode != 0 or seen is None:
        verdict("ran", ok=False, detail=(ran.stderr or ran.stdout).strip()[-500:])
        return
    print(f"  planned: device {device['index']} {device['bus_id']} NUMA {device['numa_node']}, "
          f"CPUs {instance['placement']['cpus'] or '(not bound)'}")
    print(f"  seen:    {json.dumps(seen)}")
    verdict("CUDA_VISIBLE_DEVICES as planned", seen["CUDA_VISIBLE_DEVICES"] == instance["env"]["CUDA_VISIBLE_DEVICES"])
    if "torch" in seen:
        print(f"  ({seen['torch']}: torch's view not checked)")
    else:
        verdict("torch sees one device", seen.get("count") == 1, str(seen.get("count")))
        if "bus_id" in seen:
            verdict("torch's cuda:0 is the planned device", seen["bus_id"] == device["bus_id"],
                    f"{seen['bus_id']} ({seen.get('name')})")
    node = device["numa_node"]
    allowed = set(os.sched_getaffinity(0))
    if node >= 0 and node in nodes:
        expected = sorted(set(nodes[node]) & allowed)
        verdict("CPU affinity is the device's NUMA node's", seen["affinity"] == expected,
                f"node {node}: {len(expected)} CPUs; the instance's {len(seen['affinity'])}")
    else:
        print("  (the device's NUMA node is not known: affinity not compared)")


def check_too_many(count: int) -> None:
    """Check 3: more devices than the host has is PR241."""
    print(f"3. --devices-per-instance {count + 1} on a host of {count}")
    ran = poprun("--devices-per-instance", str(count + 1), "--num-instances", "1", "true")
    first = next((line for line in ran.stderr.splitlines() if line.strip()), "")
    print(f"  {first}")
    verdict("PR241, status 2", ran.returncode == 2 and "error[PR241]" in ran.stderr, f"status {ran.returncode}")


def check_ddp() -> None:
    """Check 4: a one-instance DDP step with nccl."""
    print("4. DDP with nccl under poprun (world size 1)")
    ran = poprun("--devices-per-instance", "1", "--num-instances", "1", sys.executable, "-c", DDP)
    said = next((line.split("GPUCHECK ", 1)[1] for line in ran.stdout.splitlines() if "GPUCHECK " in line), None)
    verdict("completed", ran.returncode == 0 and said is not None,
            said or (ran.stderr or ran.stdout).strip()[-500:])


def main() -> int:
    """Run the checks; 0 when all pass (or there is no GPU to check), 1 otherwise."""
    devices = [d for d in sysfs_devices("/") if d.vendor == "nvidia"]
    if not devices and (shutil.which("nvidia-smi") is None or run_smi()[0] is None):
        print("gpu_check: no NVIDIA GPU here (none in /sys/bus/pci/devices, no working nvidia-smi): nothing to check")
        return 0
    devices, nodes = check_discovery()
    check_one_instance(nodes)
    check_too_many(len(devices))
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        check_ddp()
    else:
        print("4. DDP with nccl: skipped (no torch with CUDA here)")
    print(f"gpu_check: {'all checks passed' if not FAILED else 'FAILED: ' + ', '.join(FAILED)}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
