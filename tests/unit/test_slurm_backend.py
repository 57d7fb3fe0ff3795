"""The slurm backend's parts: srun's labelled output per instance, its reports of ended tasks, the step and the wrapper."""

import json
import os
import signal
import subprocess
import sys

from poprun.backends.slurm.backend import (
    LAUNCH,
    SRUN_PIECE,
    WRAPPER,
    LabelSplitter,
    encode_instances,
    needs_overcommit,
    parse_task_ends,
    srun_command,
)
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve

INSIDE = Context(environ={"PATH": "/usr/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-3]",
                          "SLURM_JOB_CPUS_PER_NODE": "1(x3)"}, cwd="/work")


def plan_of(*argv: str, ctx: Context = INSIDE) -> LaunchPlan:
    return solve(parse_flags(list(argv)).spec, ctx).plan


def test_labels_give_each_instance_its_lines_and_srun_keeps_its_own():
    """' 3: x' is instance 3's; consecutive lines of one instance come as one piece; unlabelled lines are srun's."""
    splitter = LabelSplitter("stdout")

    pieces = splitter.feed(b" 3: a\n 3: b\n10: c\nsrun: note\n 3: par") + splitter.feed(b"tial\n") + splitter.end()

    assert [(3, "stdout", b"a\nb\n"), (10, "stdout", b"c\n"), (None, "stdout", b"srun: note\n"),
            (3, "stdout", b"partial\n")] == pieces


def test_lines_srun_cut_into_pieces_are_joined_again():
    """srun cuts lines into labelled 1024-byte pieces (an exactly 1024-byte line gets an empty last piece)."""
    long, exact = b"y" * (2 * SRUN_PIECE + 5), b"x" * SRUN_PIECE
    cut = b"".join(b"0: " + long[i:i + SRUN_PIECE] + b"\n" for i in range(0, len(long), SRUN_PIECE))
    splitter = LabelSplitter("stderr")

    pieces = splitter.feed(cut + b"1: " + exact + b"\n0: after\n1: \n")

    joined = {i: b"".join(d for j, _, d in pieces if j == i) for i in (0, 1)}
    assert {0: long + b"\n" + b"after\n", 1: exact + b"\n"} == joined
    assert {"stderr"} == {s for _, s, _ in pieces}


def test_a_line_srun_cut_is_passed_on_as_it_comes_not_held_whole():
    """Each full 1024-byte piece goes on at once (without newline): a 200 MiB line never waits whole in the splitter."""
    splitter = LabelSplitter("stdout")

    pieces = [splitter.feed(b"0: " + b"z" * SRUN_PIECE + b"\n") for _ in range(3)]

    assert [[(0, "stdout", b"z" * SRUN_PIECE)]] * 3 == pieces


def test_slurms_note_about_the_step_is_not_the_instances():
    """'slurmstepd-h1: error: *** STEP 8.0 ... CANCELLED ... ***' arrives labelled 0 but is Slurm's."""
    note = b"slurmstepd-h1: error: *** STEP 8.0 ON h1 CANCELLED AT 2026-11-22T04:16:01 ***"

    assert [(None, "stderr", note + b"\n")] == LabelSplitter("stderr").feed(b"0: " + note + b"\n")


def test_task_ends_are_read_from_sruns_reports():
    """Exit codes and signals, one task or a range of them; other lines are not reports."""
    assert [(4, 3, None)] == parse_task_ends("srun: error: h3: task 4: Exited with exit code 3\n")
    assert [(0, None, signal.SIGKILL), (1, None, signal.SIGKILL), (3, None, signal.SIGKILL)] == parse_task_ends(
        "srun: error: h1: tasks 0-1,3: Killed")
    assert [(2, None, signal.SIGSEGV)] == parse_task_ends("srun: error: h2: task 2: Segmentation fault (core dumped)")
    assert [] == parse_task_ends("srun: error: Unable to create step for job 7: More processors requested")


def test_srun_step_places_task_i_on_instance_is_host():
    """One step: as many nodes as hosts, one task per instance, arbitrary distribution, labels, no kill-on-bad-exit."""
    plan = plan_of("--num-replicas=6", "--num-instances=6", "true")

    assert ("srun", "--job-name=step", "--nodes=3", "--ntasks=6", "--distribution=arbitrary", "--label",
            "--kill-on-bad-exit=0", "--input=none", "--overcommit", "py", "-I", "-S", "-c", WRAPPER) == srun_command(
        plan, python="py", name="step", overcommit=True)
    assert (True, False) == (needs_overcommit(plan, INSIDE.environ),
                             needs_overcommit(plan, {**INSIDE.environ, "SLURM_JOB_CPUS_PER_NODE": "2(x3)"}))


def test_srun_step_reads_stdin_for_task_0_and_takes_the_plans_mpi_plugin():
    """Forwarded stdin: --input=0 (task 0 alone); the plan's srun plugin: --mpi=NAME before the program."""
    plan = plan_of("--num-replicas=6", "--num-instances=6", "true")
    with_mpi = evolve(plan, mpi=evolve(plan.mpi, srun_plugin="pmix"))

    argv = srun_command(with_mpi, python="py", name="step", stdin=True)

    assert ("--input=0", "--mpi=pmix", "py") == (argv[7], argv[8], argv[9])
    assert not any(word.startswith("--mpi") for word in srun_command(plan, python="py", name="step"))


def test_wrapper_runs_its_instance_with_the_plans_environment(tmp_path):
    """The wrapper picks the instance of SLURM_PROCID, unsets and sets its variables, runs it in its directory."""
    code = ("import json, os; print(json.dumps([os.getcwd(), os.environ.get('POPDIST_INSTANCE_INDEX'), "
            "os.environ.get('IPUOF_CONFIG_PATH'), os.environ.get('POPRUN_SLURM_LAUNCH'), os.environ['KEPT']]))")
    ctx = Context(environ=INSIDE.environ, cwd=str(tmp_path))
    plan = plan_of("--num-replicas=3", "--num-instances=3", sys.executable, "-c", code, ctx=ctx)
    env = {**os.environ, "SLURM_PROCID": "2", LAUNCH: encode_instances(plan), "IPUOF_CONFIG_PATH": "x", "KEPT": "k"}

    done = subprocess.run([sys.executable, "-I", "-S", "-c", WRAPPER], env=env, capture_output=True, text=True,
                          check=False, timeout=30)

    assert (0, [str(tmp_path), "2", None, None, "k"]) == (done.returncode, json.loads(done.stdout)), done.stderr


def test_wrapper_reports_a_missing_program_with_127(tmp_path):
    """A program found nowhere exits 127 with one line naming it, as the other backends' status."""
    plan = plan_of("--num-replicas=2", "--host=h1", "no-such-program-here", ctx=Context(environ=INSIDE.environ, cwd=str(tmp_path)))
    env = {**os.environ, "SLURM_PROCID": "0", LAUNCH: encode_instances(plan)}

    done = subprocess.run([sys.executable, "-I", "-S", "-c", WRAPPER], env=env, capture_output=True, text=True,
                          check=False, timeout=30)

    assert (127, "poprun: instance 0: program 'no-such-program-here' not found\n") == (done.returncode, done.stderr)
