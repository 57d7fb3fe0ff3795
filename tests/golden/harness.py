"""
The golden tests' harness: run the real CLI on a case folder in a fixed context, compare or update.

A case folder holds ``case.json`` (``{"argv": [...], "env": {...}, "sys_path": [...], "sparse_files":
{"big.toml": 5000000}}``, optionally ``"ssh_hostnames": {"alias": "address"}`` and
``"resolvable": ["name", ...]``; ``"cwd": "{case}"``: the directory the plan runs in is the case folder, so that
a file the argv names relatively is read from it), any files
the argv names, and ``expected.txt``. More, for apply-time failures: ``"cwd": "/"`` the working
directory the command sees (default ``/home/user/app``, which does not exist); ``{case}`` in an
``env`` value is the case folder's path (a ``bin/`` of fake commands on PATH; it reads ``<case>``
in the expected text); ``"long_argument": N`` adds an argument of N hexadecimal digits to argv (the
same each time, and not compressible);
``"device_topology": NAME`` gives this machine the devices of a recorded server (read from sysfs; default none);
``"getrlimit_nofile": [SOFT, HARD]`` is what the limit on open files reads as; ``"sched_getaffinity":
[CPU, ...]`` the CPUs this process may use. ``sys_path`` names folders of the case put on ``sys.path``
for the run (a fake distribution whose entry points declare a backend plugin); ``"replan": {"lost": {HOST:
WHY}, "unusable": [SPARE, ...]}`` plans with argv (a ``plan ... --format json`` command), then re-plans that
plan without the lost hosts (:func:`poprun.planner.replan.replan`, as the apply step does when an attempt lost
hosts) and shows its diagnostics, or the new plan's hosts, with status 125 (a run whose host was lost ends
with it: design.md's exit statuses) or 0; ``sparse_files``
are made (of that many bytes, all NUL) before the run and removed after it. ``POPRUN_UPDATE_GOLDEN=1`` rewrites the expected files.
"""

import io
import json
import os
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.commands import common as commands
from poprun.cli.main import main
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.machine import HostTopology, load

FROM_PROCESS = Context.from_process
UPDATE = os.environ.get("POPRUN_UPDATE_GOLDEN") == "1"
OWN_PREFIXES = ("POPRUN_", "IPUOF_", "POPLAR_", "POPTORCH_", "MASTER_", "SLURM_", "CUDA_VISIBLE_", "ROCR_VISIBLE_")


def WORKSTATION() -> HostTopology:  # noqa: N802 - stands for the constant it returns
    """This machine's topology in golden cases: a recorded 8-core, one-NUMA-node workstation (devices not read, as discover)."""
    return evolve(load("workstation-1numa"), device_source="")


def NO_DEVICES(topology: HostTopology) -> HostTopology:  # noqa: N802 - stands for the constant it returns
    """This machine's devices in golden cases: none, read from sysfs (the recorded workstation has no GPU)."""
    return evolve(topology, device_source="sysfs")


def _devices(recorded: str | None) -> Callable[[HostTopology], HostTopology]:
    """This machine's devices: none (:func:`NO_DEVICES`), or with ``"device_topology": NAME`` those of a recorded server, read from sysfs."""
    if recorded is None:
        return NO_DEVICES
    devices = load(recorded).devices
    return lambda topology: evolve(topology, devices=devices, device_source="sysfs")


def case_dirs(folder: Path) -> list[Path]:
    """Return the case folders under ``folder``, sorted."""
    return sorted(p for p in folder.iterdir() if (p / "case.json").is_file())


def _hex_digits(count: int) -> str:
    """Return ``count`` hexadecimal digits, the same each time, that zlib cannot shrink much."""
    import hashlib

    digest, digits = b"poprun", []
    while len(digits) * 64 < count:
        digest = hashlib.sha256(digest).digest()
        digits.append(digest.hex())
    return "".join(digits)[:count]


def run_cli(case: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """Run the case's argv in its folder, with a fixed context (working directory /home/user/app, not root)."""
    spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
    runs = os.environ.get("POPRUN_RUNS_DIR")  # the session's (tests/conftest.py): never the case folder
    for name in [n for n in os.environ if n.startswith(OWN_PREFIXES)]:
        monkeypatch.delenv(name)
    if runs is not None:
        monkeypatch.setenv("POPRUN_RUNS_DIR", runs)
    for name, value in spec.get("env", {}).items():
        monkeypatch.setenv(name, value.replace("{case}", str(case)))
    if "getrlimit_nofile" in spec:  # a double of the limit on open files (a hard limit cannot be raised again)
        import resource

        real, fake = resource.getrlimit, tuple(spec["getrlimit_nofile"])
        monkeypatch.setattr(resource, "getrlimit", lambda which: fake if which == resource.RLIMIT_NOFILE
                            else real(which))
    if "sched_getaffinity" in spec:  # a double of the CPUs this process may use
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(spec["sched_getaffinity"]))
    for folder in spec.get("sys_path", []):
        monkeypatch.syspath_prepend(str(case / folder))
    monkeypatch.setenv("HOME", str(case))  # no vipu configuration of the machine running the tests
    monkeypatch.chdir(case)
    # Host names: ssh_config maps only those of "ssh_hostnames"; with "resolvable", a launch's names resolve only
    # if listed there (else nothing is resolved, as when planning).
    mapped, resolvable = spec.get("ssh_hostnames", {}), spec.get("resolvable")
    fixed = evolve(FROM_PROCESS(), cwd=spec.get("cwd", "/home/user/app").replace("{case}", str(case)), is_root=False,
                   probe=WORKSTATION, remote_probe=None, device_probe=_devices(spec.get("device_topology")),
                   local_names=("127.0.0.1", "::1", "localhost"), ssh_hostname=lambda name, _env: mapped.get(name, name),
                   resolves=None if resolvable is None else resolvable.__contains__)
    if "routes" in spec:  # a fake route reader: each host's answer as ``ip`` gives it (poprun.planner.netroute)
        fixed = evolve(fixed, routes=_routes(spec["routes"]))
    monkeypatch.setattr(commands.Context, "from_process", staticmethod(lambda **_: fixed))
    before = set(case.iterdir())
    for name, size in spec.get("sparse_files", {}).items():  # large inputs, made for the run, not kept in git
        with (case / name).open("wb") as made:
            made.truncate(size)
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            status = main([*spec["argv"], *([_hex_digits(spec["long_argument"])] if "long_argument" in spec else [])])
            if "replan" in spec:
                status = _replan(out.getvalue(), spec["replan"], fixed) if status == 0 else status
    finally:
        for made in set(case.iterdir()) - before:  # files a case writes (--export-config)
            made.unlink()
    return status, _located(out.getvalue(), case), _located(err.getvalue(), case)


def _located(text: str, case: Path) -> str:
    """
    Return ``text`` with the case folder's path as ``<case>``, wherever the checkout lives.

    Explain cuts a long value to 40 characters (37 and ``...``): the case folder as the cwd of a
    ``"cwd": "{case}"`` case is always that long, and its cut form is replaced by one as wide.
    """
    cut = str(case)[:37] + "..."
    return text.replace(str(case), "<case>").replace(cut, "<case>".ljust(37, ".") + "...")


def _routes(given: dict[str, str]) -> Callable[[tuple[str, ...], str], dict[str, object]]:
    """
    Return a route reader that answers for each host what ``given`` holds.

    A host's value is its answer's lines without the mark (``tool ip``, ``target A``, ``route
    ...``, ``addr ...``: what :func:`poprun.planner.netroute.host_script` prints), parsed as
    poprun parses a real host's; a value starting with ``!`` is the reason the host has none.
    """
    from poprun.planner.netroute import parse

    def read(hosts: tuple[str, ...], _master: str) -> dict[str, object]:
        found: dict[str, object] = {}
        for host in hosts:
            text = given.get(host, "!the host was not read")
            found[host] = text[1:] if text.startswith("!") else parse("".join(f"M {line}\n" for line in text.split("\n")),
                                                                     "M")
        return found

    return read


def _replan(plan_json: str, how: dict, ctx: Context) -> int:
    """Re-plan the plan of ``plan_json`` without ``how["lost"]``; write its diagnostics, or the new hosts, as the CLI would."""
    import sys

    from poprun.core.diagnostic import DiagnosticError
    from poprun.planner.replan import replan
    from poprun.planner.serde import from_json
    from poprun.render.diagnostics import render_diagnostics

    try:
        done = replan(from_json(plan_json), how["lost"], ctx, unusable=how.get("unusable", ()))
    except DiagnosticError as exc:
        sys.stderr.write(render_diagnostics(exc.diagnostics))
        return 125
    sys.stderr.write(f"replanned: {done.why}\n")
    return 0


def assert_golden(case: Path, actual: str) -> None:
    """Compare ``actual`` with the case's expected text, or rewrite it under POPRUN_UPDATE_GOLDEN=1."""
    expected_file = case / "expected.txt"
    if UPDATE:
        expected_file.write_text(actual, encoding="utf-8")
    expected = expected_file.read_text(encoding="utf-8") if expected_file.exists() else "(missing)"

    assert expected == actual, f"golden text differs; set POPRUN_UPDATE_GOLDEN=1 to update {expected_file}"
