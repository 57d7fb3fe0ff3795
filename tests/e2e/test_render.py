"""
``poprun render`` with the real Graphviz ``dot`` (Debian's ``graphviz``), and ``plan --diff``, in a subprocess.

Without ``dot`` the drawing tests skip, except under ``POPRUN_CI=1``: CI installs Graphviz
(tests/run-all.sh), so there a missing ``dot`` fails instead of hiding a broken install.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SVG = "{http://www.w3.org/2000/svg}"
POD64 = ("--num-replicas=64", "--num-instances=16", "--host=pod[1-4]", "--vipu-partition=pod64",
         "--vipu-server-host=vipu.example", "python3", "train.py")
POD_1024 = ("--num-replicas=1024", "--num-instances=256", "--host=pod[1-64]", "python3", "train.py")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NO_DOT_PATH = "/nonexistent"


@pytest.fixture
def dot() -> str:
    """Return the path of Graphviz's dot; skip (fail in CI) where there is none."""
    found = shutil.which("dot")
    if found is None:
        if os.environ.get("POPRUN_CI"):
            pytest.fail("CI must have Graphviz's dot (tests/run-all.sh installs it)")
        pytest.skip("Graphviz's dot is not on PATH")
    return found


def poprun(*args: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (with ``PATH`` replaced when ``path`` is given)."""
    env = dict(os.environ) if path is None else {**os.environ, "PATH": path}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def svg_texts(file: Path) -> list[str]:
    """Return the text of every <text> element of an SVG file (which must parse as XML with an <svg> root)."""
    root = ET.parse(file).getroot()  # noqa: S314 - dot's own output, made by the test
    assert f"{SVG}svg" == root.tag
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def png_size(file: Path) -> tuple[int, int]:
    """Return a PNG's width and height from its IHDR chunk."""
    data = file.read_bytes()
    assert PNG_MAGIC == data[:8]
    assert b"IHDR" == data[12:16]
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.usefixtures("dot")
def test_pod64_plan_renders_as_valid_svg_with_its_hosts_and_ild(tmp_path: Path) -> None:
    result = poprun("render", "-o", "topology.svg", *POD64, cwd=tmp_path)

    assert (0, "") == (result.returncode, result.stderr)
    texts = svg_texts(tmp_path / "topology.svg")
    assert {"ILD 0", "host pod1", "host pod2", "host pod3", "host pod4", "partition pod64"} <= set(texts)
    assert 16 == sum(1 for t in texts if t.startswith("instance "))


@pytest.mark.usefixtures("dot")
def test_a_1024_replica_plan_on_64_hosts_renders_grouped(tmp_path: Path) -> None:
    result = poprun("render", "--format", "svg", "-o", "big.out", *POD_1024, cwd=tmp_path)

    assert (0, "") == (result.returncode, result.stderr)
    texts = svg_texts(tmp_path / "big.out")
    assert {"ILDs 0-15 x 4 hosts each", "pod[1-64] x 4 instances each", "instances 0-255"} <= set(texts)
    assert not any(t.startswith("host ") for t in texts)


@pytest.mark.usefixtures("dot")
def test_png_has_sane_dimensions(tmp_path: Path) -> None:
    result = poprun("render", "-o", "topology.png", *POD64, cwd=tmp_path)

    assert 0 == result.returncode, result.stderr
    width, height = png_size(tmp_path / "topology.png")
    assert 400 <= width <= 4000
    assert 200 <= height <= 4000


@pytest.mark.usefixtures("dot")
def test_svg_goes_to_standard_output_without_a_file(tmp_path: Path) -> None:
    result = poprun("render", "--num-replicas=4", "--format=svg", cwd=tmp_path)

    assert 0 == result.returncode, result.stderr
    assert "</svg>" in result.stdout


def test_without_dot_svg_is_refused_with_pr410_and_dot_text_still_works(tmp_path: Path) -> None:
    # WHEN dot is not on PATH
    svg = poprun("render", "-o", "topology.svg", *POD64, cwd=tmp_path, path=NO_DOT_PATH)
    text = poprun("render", "-o", "topology.gv", *POD64, cwd=tmp_path, path=NO_DOT_PATH)

    # THEN the picture fails as an environment problem, and nothing is written; DOT is written
    assert 125 == svg.returncode
    assert "error[PR410]: Graphviz's 'dot' program not found" in svg.stderr
    assert "apt-get install graphviz" in svg.stderr
    assert not (tmp_path / "topology.svg").exists()
    assert (0, "") == (text.returncode, text.stderr)
    assert (tmp_path / "topology.gv").read_text().startswith("digraph poprun {\n")


def test_plan_diff_exits_0_with_and_without_differences(tmp_path: Path) -> None:
    # GIVEN a saved plan
    made = poprun("plan", "--format", "json", "-o", "old.json", "--num-replicas=8", "--num-instances=2",
                  "python3", "train.py", cwd=tmp_path)
    assert 0 == made.returncode, made.stderr

    # WHEN the same and another command line are compared with it
    same = poprun("plan", "--diff", "old.json", "--num-replicas=8", "--num-instances=2", "python3", "train.py",
                  cwd=tmp_path)
    other = poprun("plan", "--diff", "old.json", "--num-replicas=8", "--num-instances=4", "python3", "train.py",
                   cwd=tmp_path)

    # THEN
    assert (0, "--- old.json\n+++ the plan of this command line\nno differences\n") == (same.returncode, same.stdout)
    assert 0 == other.returncode
    assert "  num_instances: 2 -> 4\n" in other.stdout
