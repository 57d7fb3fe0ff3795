"""Files as editors write them: a UTF-8 byte-order mark is read past; UTF-16 and UTF-32 text is a clear PR118."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
BOM = b"\xef\xbb\xbf"


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | {"POPRUN_RUNS_DIR": str(cwd / "runs")}, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)


SPECS = {
    "train.pop": b"hosts localhost\n2 replicas over 2 instances\nrun python3 train.py\n",
    "train.toml": b'[topology]\nhosts = ["localhost"]\nreplicas = 2\ninstances = 2\n\n[program]\nargv = ["python3", "train.py"]\n',
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_spec_that_starts_with_a_byte_order_mark_plans_as_without_it(tmp_path: Path, name: str) -> None:
    """A spec saved by an editor that writes a UTF-8 BOM gives the same plan as the same spec without one."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / name).write_bytes(SPECS[name])
    (tmp_path / name).write_bytes(BOM + SPECS[name])

    with_bom = poprun("plan", name, "--format", "json", cwd=tmp_path)
    without = poprun("plan", name, "--format", "json", cwd=tmp_path / "plain")

    assert (0, "") == (with_bom.returncode, with_bom.stderr)
    assert without.stdout.replace(str(tmp_path / "plain"), str(tmp_path)) == with_bom.stdout


def test_a_saved_plan_host_file_and_imported_configuration_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    """plan.json, --host-file and --import-config files that start with a UTF-8 BOM are read as without it."""
    made = poprun("plan", "--num-replicas", "2", "--format", "json", "-o", "plan.json", "python3", "train.py",
                  cwd=tmp_path)
    assert 0 == made.returncode, made.stderr
    plan = tmp_path / "plan.json"
    plan.write_bytes(BOM + plan.read_bytes())
    (tmp_path / "hosts.txt").write_bytes(BOM + b"localhost\n")
    (tmp_path / "job.conf").write_bytes(BOM + b"[topology]\nreplicas = 4\n")

    saved = poprun("plan", "plan.json", cwd=tmp_path)
    applied = poprun("apply", "plan.json", cwd=tmp_path)
    hosts = poprun("plan", "--host-file", "hosts.txt", "python3", "train.py", cwd=tmp_path)
    imported = poprun("plan", "--import-config", "job.conf", "python3", "train.py", cwd=tmp_path)

    assert [(0, "")] * 3 == [(done.returncode, done.stderr) for done in (saved, hosts, imported)]
    assert "2 replicas x 1 IPU" in saved.stdout
    assert "(localhost)" in hosts.stdout
    assert "4 replicas x 1 IPU" in imported.stdout
    assert "PR1" not in applied.stderr  # it ran: python3 train.py is missing here, which is the program's own error


@pytest.mark.parametrize(("encoding", "shown"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"),
                                                 ("utf-16-le", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_spec_is_pr118_naming_its_encoding(tmp_path: Path, encoding: str, shown: str) -> None:
    """A spec saved as UTF-16 or UTF-32 (with or without a byte-order mark) is PR118 saying which, exit 2."""
    data = SPECS["train.pop"].decode().encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data
    (tmp_path / "train.pop").write_bytes(data)

    done = poprun("plan", "train.pop", cwd=tmp_path)

    assert 2 == done.returncode
    assert done.stderr.startswith(f"error[PR118]: 'train.pop' is {shown} text, not UTF-8\n"), done.stderr
    assert f"= hint: save the file as UTF-8 text (iconv -f {shown} -t UTF-8 train.pop)" in done.stderr


TOPOLOGY = b'{"numa_nodes": [{"index": 0, "socket": 0, "cores": [[0], [1]]}]}'


@pytest.mark.parametrize(("given", "expected"), [
    ("/dev/zero", "'/dev/zero' is a character device; poprun reads only regular files"),
    ("fifo", "is a FIFO (named pipe); poprun reads only regular files"),
    ("topology.json", None),  # with a byte-order mark: read
])
def test_the_host_topology_file_is_read_with_the_same_bounds(tmp_path: Path, given: str, expected: str | None) -> None:
    """POPRUN_HOST_TOPOLOGY=/dev/zero (or a FIFO nobody writes) is PR307 at once, not a read without end."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "topology.json").write_bytes(BOM + TOPOLOGY)
    path = given if given.startswith("/") else str(tmp_path / given)

    done = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--numa-aware", "yes", "python3", "x.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
                          env=os.environ | {"POPRUN_HOST_TOPOLOGY": path}, stdin=subprocess.DEVNULL)

    if expected is None:
        assert (0, "") == (done.returncode, done.stderr)
        return
    assert 2 == done.returncode
    assert done.stderr.startswith("error[PR307]: cannot read the host topology\n"), done.stderr
    assert expected in done.stderr
