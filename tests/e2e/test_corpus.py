"""
Every real poprun command line of the corpus through ``poprun plan --format json``.

Each row either plans, with the replica, instance and host numbers its flags say, or fails
with exit status 2 and a diagnostic for a real mistake in it (an ambiguous prefix, a host
list split by a space, numbers that do not divide, an option given twice with two values).
"""

import csv
import io
import json
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.main import main

CORPUS = Path(__file__).parent.parent / "data" / "poprun-commands.tsv"
SAMPLE = {
    "HOSTS": "pod1,pod2", "HOSTS_4": "pod1,pod2,pod3,pod4", "HOSTS_8": "pod[1-8]", "MAINHOST": "pod1",
    "TCP_IF_INCLUDE": "10.5.0.0/16", "VIPU_CLI_API_HOST": "vipu.example", "VIPU_SERVER_HOST": "vipu.example",
    "VIPU_SERVER": "vipu.example", "IPUOF_VIPU_API_HOST": "vipu.example", "IPUOF_VIPU_API_PARTITION_ID": "p64",
    "PARTITION": "p64", "CLUSTER": "c64", "VIPU_CLUSTER_ID": "c64", "VIPU_ALLOCATION_ID": "c64", "ALLOCATION": "c64",
    "REPLICAS": "8", "INSTANCES": "2", "NUM_REPLICA": "8", "NUM_INSTANCE": "2", "NUM_ILDS": "1",
    "MPI_SETTINGS": "--mpi-global-args='--tag-output --allow-run-as-root' --mpi-local-args='-x PYTHONPATH -x PATH' "
                    "--update-partition=yes --reset-partition=no --vipu-server-timeout=600",
    "MULTIHOST_SETTINGS": "--host pod1,pod2", "POPRUN_OPTIONS": "--vipu-server-host=vipu.example --vipu-partition=p64",
    "MPI_GLOBAL_ARGS": "--tag-output", "MPI_LOCAL_ARGS": "-x PYTHONPATH",
}
SHELL_STOP = ("|", "||", "&&", ";", "&", ">", ">>", "2>&1", "2>", "1>", ">&")
MISTAKES = {"PR102", "PR104", "PR105", "PR106", "PR111", "PR300", "PR301", "PR302"}
NUMBERS = ("--num-replicas", "--num-instances", "--num-ilds", "--ipus-per-replica")


def _argv(command: str) -> list[str] | None:
    text = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", lambda m: SAMPLE.get(m.group(1) or m.group(2), "x"), command)
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    out = []
    for word in words[words.index("poprun") + 1:]:
        if word in SHELL_STOP or word.startswith((">", "2>", "|")):
            break
        out.append(word)
    return out


def _plan(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["plan", "--format", "json", *argv])
    return status, out.getvalue(), err.getvalue()


def _flag(argv: list[str], *names: str) -> str | None:
    """An independent reading: every option but the verbosity flags takes a value."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name in names:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else "-")
        i += 1 if eq or name in ("-v", "-vv", "--vv", "--verbose") else 2
    return None


def _placeholder(argv: list[str]) -> bool:
    """Whether a number flag holds a sample placeholder (not a swallowed option: that is a real mistake)."""
    values = [_flag(argv, name) for name in NUMBERS]
    return any(v is not None and not v.isdigit() and not v.startswith("-") for v in values)


def _check(argv: list[str]) -> str:
    if _placeholder(argv):
        return "skipped (a placeholder where a number belongs)"
    status, out, err = _plan(argv)
    if "Traceback" in err:
        return "traceback"
    if status == 2:
        codes = set(re.findall(r"error\[(PR\d+)\]", err))
        return "mistake" if codes & MISTAKES else f"error {sorted(codes)}"
    plan = json.loads(out)
    replicas = _flag(argv, "--num-replicas")
    assert plan["topology"]["num_replicas"] == int(replicas or 1)
    instances = _flag(argv, "--num-instances", "--num-instance")
    if instances:
        assert plan["topology"]["num_instances"] == int(instances)
    assert len(plan["instances"]) == plan["topology"]["num_instances"]
    per = plan["topology"]["replicas_per_instance"]
    assert [i["replica_offset"] for i in plan["instances"]] == [k * per for k in range(len(plan["instances"]))]
    return "planned"


@pytest.mark.e2e
def test_every_corpus_row_plans_or_names_a_real_mistake(request):
    """Real command lines plan correctly or get a diagnostic for a real mistake; the counts are printed."""
    rows = list(csv.DictReader(io.StringIO(CORPUS.read_text(encoding="utf-8")), delimiter="\t"))
    counts: dict[str, int] = {}
    unexpected = []
    for row in rows:
        command = row["command"]
        argv = None if re.search(r"\{[^}]*\}|<[^>]*>|\.\.\.|…", command) else _argv(command)
        outcome = "skipped (placeholders or unbalanced quotes)" if argv is None else _check(argv)
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome in ("traceback",) or outcome.startswith("error"):
            unexpected.append(f"{row['id']}: {outcome}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    if reporter is not None:
        reporter.write_line(f"\ncorpus: {len(rows)} rows: {summary}")

    assert [] == unexpected
    assert counts.get("planned", 0) > 200
