"""Whatever the words, ``poprun plan`` and ``poprun validate`` answer with a plan or a diagnostic, never a traceback."""

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poprun.cli.main import main

WORDS = ["--num-replicas", "--num-instances", "--num-ilds", "--ipus-per-replica", "--host", "-H", "=", "4", "0",
         "-1", "a,", "b", "pod[1-2", "pod[1-3]", "--mpi-local-args", "-x", "'", '"', "--vv", "-v", "--num",
         "--offline-mode", "--offline-target", "pod16", "yes", "--instance-mpi-local-args", "0:-x A=b", "--",
         "--format", "json", "toml", "--explain", "-o", "--export-config", "--import-config", "spec.toml",
         "spec.pop", "plan.json", "--print-topology", "python3", "x.py", "--autoreport-dir", "/tmp/p",
         "--executable-cache-path", "", "--vipu-server-port", "99999", "--host-file", "hosts.txt", "é", "\n"]
FILES = {"spec.toml": "[topology]\nreplicas = 4\ninstances = 2\n[program]\nargv = ['x']\n",
         "spec.pop": "4 replicas over 2 instances\nrun x\n", "plan.json": "{}", "hosts.txt": "pod1\npod2\n"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    for name, text in FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["plan", "validate"]), st.lists(st.sampled_from(WORDS) | st.text(max_size=6), max_size=8))
def test_plan_and_validate_never_raise(workdir, monkeypatch, command, words):
    """Any argv gives exit status 0 or 2 and no traceback."""
    monkeypatch.chdir(workdir)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main([command, *words])

    assert status in (0, 2)
    assert "internal error" not in err.getvalue()
