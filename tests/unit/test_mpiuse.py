"""Whether a program will call MPI: Python imports, -m and -c, linked binaries, and files never to read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.mpiuse import mpirun_path, probe
from poprun.planner.solve import solve

PATH = {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize(("text", "expected"), [
    ("from mpi4py import MPI\n", "train.py imports mpi4py"),
    ("import os\n  import horovod.torch as hvd\n", "train.py imports horovod"),
    ("import torch\nimport popdist\n", None),
    ("# import mpi4py in a comment\nx = 'from mpi4py import MPI'\n", None),
    ("import json, os; from mpi4py import MPI; print(MPI.COMM_WORLD.rank)\n", "train.py imports mpi4py"),
    ("import os, mpi4py\n", "train.py imports mpi4py"),
    ("import os as o, horovod.torch as hvd\n", "train.py imports horovod"),
    ("import mpi4pyx\n", None),
])
def test_a_python_script_calls_mpi_when_it_imports_mpi4py_or_horovod(tmp_path: Path, text: str,
                                                                    expected: str | None) -> None:
    """An import statement of mpi4py or horovod at the start of a line; comments and strings are not imports."""
    (tmp_path / "train.py").write_text(text)

    assert expected == probe(("python3", "-u", "train.py", "--epochs", "3"), str(tmp_path), PATH)


@pytest.mark.parametrize(("first_line", "expected"), [
    ("#!/usr/bin/env python3", "./train.py imports mpi4py"),
    ("#!/usr/bin/python3.11 -u", "./train.py imports mpi4py"),
    ("#!/bin/sh", None),  # a shell script that mentions mpi4py is no Python
])
def test_an_executable_python_script_with_a_shebang_is_read_as_python(tmp_path: Path, first_line: str,
                                                                      expected: str | None) -> None:
    """``./train.py`` run by its ``#!`` line: a Python interpreter there makes it a Python program, read as one."""
    script = tmp_path / "train.py"
    script.write_text(f"{first_line}\nfrom mpi4py import MPI\n")
    script.chmod(0o755)

    assert expected == probe(("./train.py", "--epochs", "3"), str(tmp_path), PATH)


@pytest.mark.parametrize(("argv", "expected"), [
    (("python3", "-m", "mpi4py", "train.py"), "it runs the module mpi4py"),
    (("python3", "-m", "mpi4py.bench", "helloworld"), "it runs the module mpi4py.bench"),
    (("python", "-c", "from mpi4py import MPI"), "its code imports mpi4py"),
    (("python3.11", "-W", "ignore", "-m", "torch.distributed.run", "x.py"), None),
    (("python3", "-c", "print(1)"), None),
    (("echo", "from mpi4py import MPI"), None),
    ((), None),
])
def test_interpreter_arguments_are_read_as_python_reads_them(tmp_path: Path, argv: tuple[str, ...],
                                                             expected: str | None) -> None:
    """-m names a module, -c holds code, -W takes a value; a program that is not Python is not read as Python."""
    assert expected == probe(argv, str(tmp_path), PATH)


def test_a_binary_linked_with_libmpi_calls_mpi(tmp_path: Path) -> None:
    """An ELF file that needs libmpi.so (its dynamic string table names it) calls MPI; one that does not, does not."""
    for name, needed in (("ring", b"libmpi.so.40"), ("plain", b"libc.so.6")):
        (tmp_path / name).write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100 + needed + b"\0")
        (tmp_path / name).chmod(0o755)

    assert ("./ring is linked with Open MPI's libmpi", None) == (
        probe(("./ring",), str(tmp_path), PATH), probe(("./plain",), str(tmp_path), PATH))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "missing"])
def test_a_script_that_is_not_a_regular_file_is_never_read(tmp_path: Path, kind: str) -> None:
    """A FIFO (nobody writes: a read would hang), /dev/zero (endless), a directory or nothing: no MPI, at once."""
    script = tmp_path / "train.py"
    if kind == "fifo":
        os.mkfifo(script)
    elif kind == "device":
        script.symlink_to("/dev/zero")
    elif kind == "directory":
        script.mkdir()

    assert probe(("python3", "train.py"), str(tmp_path), PATH) is None


def test_a_huge_script_is_read_only_in_part(tmp_path: Path) -> None:
    """An import past the first 4 MiB is not seen: the read is bounded."""
    (tmp_path / "train.py").write_bytes(b"#" * (5 << 20) + b"\nimport mpi4py\n")

    assert probe(("python3", "train.py"), str(tmp_path), PATH) is None


def test_mpirun_is_found_on_path_only(tmp_path: Path) -> None:
    """mpirun is looked for on PATH, never in the working directory."""
    (tmp_path / "mpirun").write_text("#!/bin/sh\n")
    (tmp_path / "mpirun").chmod(0o755)

    assert (str(tmp_path / "mpirun"), None) == (mpirun_path({"PATH": str(tmp_path)}),
                                                 mpirun_path({"PATH": str(tmp_path / "none")}))


def _backend(argv: list[str], *, mpirun: str | None) -> tuple[str, tuple[str, ...]]:
    ctx = Context(environ={}, cwd="/app", mpi_probe=lambda a, _cwd: "train.py imports mpi4py" if "mpi" in a[-1] else None,
                  mpirun=lambda: mpirun)
    plan = solve(parse_flags(argv, environ={}).spec, ctx).plan
    return plan.backend.name, tuple(w.code for w in plan.warnings)


@pytest.mark.parametrize(("argv", "mpirun", "expected"), [
    (["--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun", ("mpirun", ())),
    (["--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], None, ("local", ("PR313",))),
    (["--num-instances", "1", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun", ("local", ())),
    (["--num-instances", "2", "--num-replicas", "2", "python3", "train.py"], "/usr/bin/mpirun", ("local", ())),
    (["--backend", "local", "--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun",
     ("local", ())),
    (["--host", "h1,h2", "--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"],
     "/usr/bin/mpirun", ("offline", ("PR313",))),
])
def test_a_program_that_calls_mpi_runs_under_mpirun_when_it_can(argv: list[str], mpirun: str | None,
                                                                expected: tuple[str, tuple[str, ...]]) -> None:
    """Several instances of an MPI program: mpirun when found, else PR313; one instance or --backend: as before."""
    assert expected == _backend(argv, mpirun=mpirun)


SLURM = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "h[1-3]", "SLURM_TASKS_PER_NODE": "2(x3)",
         "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}


def _in_slurm(argv: list[str], *, plugins: tuple[str, ...] | None, mpirun: str | None = "/usr/bin/mpirun",
              environ: dict[str, str] | None = None) -> tuple[str, str | None, tuple[str, ...]]:
    env = SLURM | (environ or {})
    ctx = Context(environ=env, cwd="/app", mpi_probe=lambda a, _cwd: "mpi.py imports mpi4py" if "mpi" in a[-1] else None,
                  mpirun=lambda: mpirun, srun_mpi=lambda: plugins)
    found = solve(parse_flags(argv, environ=env).spec, ctx)
    return found.plan.backend.name, found.plan.mpi.srun_plugin, tuple(w.code for w in found.plan.warnings)


@pytest.mark.parametrize(("argv", "plugins", "mpirun", "environ", "expected"), [
    # pmix listed: the slurm backend, srun --mpi=pmix; one instance counts too (a task of an srun step)
    (["--num-replicas", "6", "python3", "mpi.py"], ("pmix", "none", "pmix_v4"), None, {}, ("slurm", "pmix", ())),
    (["--host", "h1", "--num-instances", "1", "--num-replicas", "2", "python3", "mpi.py"], ("pmix",), None, {},
     ("slurm", "pmix", ())),
    # the user's SLURM_MPI_TYPE is theirs, whatever srun lists
    (["--num-replicas", "6", "python3", "mpi.py"], ("none", "pmi2"), None, {"SLURM_MPI_TYPE": "pmi2"},
     ("slurm", "pmi2", ())),
    (["--num-replicas", "6", "python3", "mpi.py"], None, None, {"SLURM_MPI_TYPE": "pmix_v4"}, ("slurm", "pmix_v4", ())),
    # no pmix, mpirun found: mpirun, which starts its daemons through Slurm
    (["--num-replicas", "6", "python3", "mpi.py"], ("none", "pmi2"), "/usr/bin/mpirun", {}, ("mpirun", None, ())),
    (["--num-replicas", "6", "python3", "mpi.py"], None, "/usr/bin/mpirun", {}, ("mpirun", None, ())),
    # a program that does not call MPI: srun's default, as before
    (["--num-replicas", "6", "python3", "train.py"], ("pmix",), None, {}, ("slurm", None, ())),
    # --backend mpirun inside the allocation: no srun plugin
    (["--backend", "mpirun", "--num-replicas", "6", "python3", "mpi.py"], ("pmix",), None, {}, ("mpirun", None, ())),
])
def test_an_mpi_program_inside_slurm_gets_an_srun_plugin_that_starts_it(
        argv: list[str], plugins: tuple[str, ...] | None, mpirun: str | None, environ: dict[str, str],
        expected: tuple[str, str | None, tuple[str, ...]]) -> None:
    """Inside an allocation: srun --mpi=pmix where srun has it, else mpirun through Slurm; the user's SLURM_MPI_TYPE wins."""
    assert expected == _in_slurm(argv, plugins=plugins, mpirun=mpirun, environ=environ)


@pytest.mark.parametrize("argv", [
    ["--num-replicas", "6", "python3", "mpi.py"],
    ["--backend", "slurm", "--num-replicas", "6", "python3", "mpi.py"],
])
def test_an_mpi_program_inside_slurm_with_no_plugin_and_no_mpirun_is_pr230_before_the_launch(argv: list[str]) -> None:
    """No pmix and no mpirun (or --backend slurm given): PR230, nothing starts."""
    env = SLURM
    ctx = Context(environ=env, cwd="/app", mpi_probe=lambda _a, _cwd: "mpi.py imports mpi4py", mpirun=lambda: None,
                  srun_mpi=lambda: ("none",))
    with pytest.raises(DiagnosticError) as raised:
        solve(parse_flags(argv, environ=env).spec, ctx)

    assert ["PR230"] == [d.code for d in raised.value.diagnostics if d.is_error]


def test_the_srun_plugin_is_explained() -> None:
    """plan --explain shows the choice: srun mpi = pmix, and why."""
    ctx = Context(environ=SLURM, cwd="/app", mpi_probe=lambda _a, _cwd: "mpi.py imports mpi4py", mpirun=lambda: None,
                  srun_mpi=lambda: ("pmix",))
    plan = solve(parse_flags(["--num-replicas", "6", "python3", "mpi.py"], environ=SLURM).spec, ctx).plan

    assert [("pmix", "derived")] == [(d.value, d.source.split(":")[0]) for d in plan.explanation if d.key == "srun mpi"]


@pytest.mark.parametrize(("value", "plugins"), [
    ("pmix --export=NONE", None),  # not a plugin's name: it would reach srun's argv as one word
    ("pmix;id", ("pmix",)),
    ("pmi3", ("none", "pmix", "pmi2")),  # a name srun does not list
])
def test_slurm_mpi_type_that_names_no_plugin_is_pr231_before_the_launch(value: str,
                                                                        plugins: tuple[str, ...] | None) -> None:
    """The user's SLURM_MPI_TYPE for an MPI program must be one of srun's plugins: else PR231, nothing starts."""
    env = SLURM | {"SLURM_MPI_TYPE": value}
    ctx = Context(environ=env, cwd="/app", mpi_probe=lambda _a, _cwd: "mpi.py imports mpi4py", mpirun=lambda: None,
                  srun_mpi=lambda: plugins)
    with pytest.raises(DiagnosticError) as raised:
        solve(parse_flags(["--num-replicas", "6", "python3", "mpi.py"], environ=env).spec, ctx)

    assert ["PR231"] == [d.code for d in raised.value.diagnostics if d.is_error]
