"""``--export-config``, ``--import-config`` and ``--overwrite-config`` with the seed's semantics (section 2.9)."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.main import main

SEED = ["--vipu-partition=my_partition", "--vipu-allocation=allocation1", "--vipu-server-host=vipu.my_domain",
        "--vipu-server-port=34521", "--update-partition=yes", "--remove-partition=no", "--num-replicas=32",
        "--num-instances=2", "--num-ilds=2", "--host", "pod[1-2]"]
# The seed writes --host pod[1-4] with 2 instances; instances must divide across hosts (PR301),
# so the example here uses two hosts.


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def plan_json(*argv: str) -> dict:
    status, out, err = run("plan", "--format", "json", *argv)
    assert 0 == status, err
    return json.loads(out)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_export_then_import_repeats_the_command_line(here):
    """The exported file, imported, plans exactly like the command line it came from."""
    # GIVEN a launch exported with --export-config
    assert 0 == run("plan", "--export-config", "training.conf", *SEED, "python3", "train.py")[0]

    # WHEN it is imported alone
    imported = plan_json("--import-config", "training.conf")

    # THEN the plan is the command line's
    assert plan_json(*SEED, "python3", "train.py")["instances"] == imported["instances"]
    assert imported["partition"]["name"] == "my_partition"


def test_exported_file_is_a_toml_spec(here):
    """The exported configuration is the TOML spec format, readable by ``poprun validate``."""
    run("plan", "--export-config", "training.conf", *SEED, "python3", "train.py")
    text = (here / "training.conf").read_text(encoding="utf-8")

    assert "[topology]" in text
    assert 'hosts = "pod[1-2]"' in text
    assert (0, "training.conf: ok\n") == run("validate", "training.conf")[:2]


def test_command_line_overrides_the_imported_values(here):
    """``--import-config training.conf --num-instances=4 python3 train.py --hyper-param=1`` (the seed's example)."""
    run("plan", "--export-config", "training.conf", *SEED, "python3", "train.py")
    plan = plan_json("--import-config", "training.conf", "--num-instances=4", "python3", "train.py",
                     "--hyper-param=1")

    assert 4 == plan["topology"]["num_instances"]
    assert ["python3", "train.py", "--hyper-param=1"] == plan["instances"][0]["argv"]
    assert 32 == plan["topology"]["num_replicas"]


def test_overriding_does_not_change_the_file(here):
    """An override on import is not written back to the file."""
    run("plan", "--export-config", "training.conf", *SEED, "python3", "train.py")
    before = (here / "training.conf").read_text(encoding="utf-8")
    plan_json("--import-config", "training.conf", "--num-instances=4")

    assert before == (here / "training.conf").read_text(encoding="utf-8")


def test_existing_file_is_kept_and_a_time_stamped_one_written(here):
    """Without --overwrite-config, an existing file stays and the new one gets a time stamp (PR214)."""
    (here / "training.conf").write_text("# mine\n", encoding="utf-8")
    status, _, err = run("plan", "--export-config", "training.conf", "--num-replicas=2", "python3", "x.py")
    stamped = [p.name for p in here.iterdir() if p.name.startswith("training.conf.")]

    assert 0 == status
    assert "# mine\n" == (here / "training.conf").read_text(encoding="utf-8")
    assert 1 == len(stamped)
    assert "warning[PR214]" in err


def test_overwrite_config_replaces_the_file(here):
    """``--overwrite-config=yes`` replaces an existing file."""
    (here / "training.conf").write_text("# mine\n", encoding="utf-8")
    run("plan", "--export-config", "training.conf", "--overwrite-config=yes", "--num-replicas=2", "python3", "x.py")

    assert "replicas = 2" in (here / "training.conf").read_text(encoding="utf-8")
    assert [] == [p for p in here.iterdir() if p.name.startswith("training.conf.")]


def test_export_and_import_together_are_refused(here):
    """``--export-config`` with ``--import-config`` is PR201, exit 2."""
    status, _, err = run("plan", "--export-config=a.conf", "--import-config=b.conf", "x")

    assert 2 == status
    assert "error[PR201]" in err


def test_export_continues_to_launch(here):
    """With --export-config the classic form still runs the program (offline, on this machine)."""
    status, _, _ = run("--export-config", "run.conf", "--num-instances=2", "--num-replicas=2", "--offline-mode=1",
                       "true")

    assert 0 == status
    assert Path("run.conf").is_file()
