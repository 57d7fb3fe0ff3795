"""
Hostile and odd inputs through the flags, TOML and DSL front ends and the file readers: a diagnostic, never a traceback, a hang or a silent reinterpretation.

Each case runs the real CLI in a folder holding its files and names the exit status and the code
of the first diagnostic (None where the input is valid); a case that is accepted must show its
program in the plan text, so that nothing is swallowed unseen.
"""

import io
import os
from contextlib import redirect_stderr, redirect_stdout

import pytest

from poprun.cli.main import main

TOML_RUN = '[program]\nargv = ["python3", "train.py"]\n'
CASES: list[tuple[str, list[str], dict[str, str | bytes], int, str | None]] = [
    # id, argv, files, exit status, first code
    ("missing toml", ["plan", "nosuch.toml"], {}, 2, "PR113"),
    ("missing TOML in capitals", ["plan", "nosuch.TOML"], {}, 2, "PR113"),
    ("missing pop", ["plan", "nosuch.pop"], {}, 2, "PR113"),
    ("missing conf", ["plan", "nosuch.Conf"], {}, 2, "PR113"),
    ("missing json", ["plan", "nosuch.json"], {}, 2, "PR113"),
    ("missing json after options", ["plan", "--explain", "nosuch.json"], {}, 2, "PR113"),
    ("spec is dev zero", ["plan", "/dev/zero.toml"], {}, 2, "PR113"),
    ("host file dev zero", ["plan", "--host-file", "/dev/zero", "x"], {}, 2, "PR116"),
    ("host file dev null", ["plan", "--host-file", "/dev/null", "x"], {}, 2, "PR116"),
    ("host file is a directory", ["plan", "--host-file", ".", "x"], {}, 2, "PR116"),
    ("import config dev zero", ["plan", "--import-config", "/dev/zero", "x"], {}, 2, "PR116"),
    ("diff dev zero", ["plan", "--diff", "/dev/zero", "x"], {}, 2, "PR116"),
    ("apply dev stdin", ["apply", "/dev/stdin.json"], {}, 2, "PR113"),
    ("dsl hosts from dev zero", ["plan", "s.pop"], {"s.pop": "hosts from file /dev/zero\nrun x\n"}, 2, "PR116"),
    ("spec not utf8", ["plan", "s.toml"], {"s.toml": b"[topology]\n# \xff\n"}, 2, "PR118"),
    ("host file with nul", ["plan", "--host-file", "h.txt", "x"], {"h.txt": b"pod1\npod\x002\n"}, 2, "PR118"),
    ("host range too large", ["plan", "--host", "pod[1-999999999]", "x"], {}, 2, "PR103"),
    ("host file range too large", ["plan", "--host-file", "h.txt", "x"], {"h.txt": "pod[1-999999999]\n"}, 2, "PR103"),
    ("toml host range too large", ["plan", "s.toml"], {"s.toml": '[topology]\nhosts = "pod[1-999999999]"\n'}, 2, "PR103"),
    ("host starting with dash", ["plan", "--host", "-oProxyCommand", "x"], {}, 2, "PR103"),
    ("toml host starting with dash", ["plan", "s.toml"], {"s.toml": '[topology]\nhosts = ["-evil"]\n'}, 2, "PR103"),
    ("host with semicolon", ["plan", "--host", "a;b", "x"], {}, 2, "PR103"),
    ("host with space", ["plan", "--host", "a b", "x"], {}, 2, "PR103"),
    ("nineteen digits", ["plan", "--num-instances", "1234567890123456789", "x"], {}, 2, "PR216"),
    ("forty digits", ["plan", "--num-replicas", "1" * 40, "x"], {}, 2, "PR216"),
    ("nineteen digits in env", ["plan", "x"], {"env:POPRUN_NUM_REPLICAS": "9" * 19}, 2, "PR216"),
    ("nineteen digits in dsl", ["plan", "s.pop"], {"s.pop": f"{'9' * 19} replicas\nrun x\n"}, 2, "PR216"),
    ("hex count", ["plan", "--num-replicas", "0x10", "x"], {}, 2, "PR105"),
    ("full-width digit", ["plan", "--num-replicas", "\uff14", "x"], {}, 2, "PR105"),
    ("dangling -x", ["plan", "--mpi-local-args=-x", "x"], {}, 2, "PR104"),
    ("dangling -x global", ["plan", "--mpi-global-args", "--tag-output -x", "x"], {}, 2, "PR104"),
    ("-x A B", ["plan", "--mpi-local-args=-x A B", "x"], {}, 2, "PR105"),
    ("-x A B per instance", ["plan", "--instance-mpi-local-args", "0:-x A B", "x"], {}, 2, "PR105"),
    ("toml -x A B", ["plan", "s.toml"], {"s.toml": '[mpi]\nlocal_args = ["-x", "A", "B"]\n' + TOML_RUN}, 2, "PR105"),
    ("dsl dangling -x", ["plan", "s.pop"], {"s.pop": 'mpi local "-x"\nrun x\n'}, 2, "PR104"),
    ("-x A then option", ["plan", "--mpi-local-args=-x A --bind-to none", "x"], {}, 0, None),
    ("server unbalanced bracket", ["plan", "s.toml"], {"s.toml": '[partition]\nserver = "[::1"\n' + TOML_RUN}, 2, "PR105"),
    ("server flag unbalanced", ["plan", "--vipu-server-host", "[::1", "x"], {}, 2, "PR105"),
    ("server closing bracket only", ["plan", "--vipu-server-host", "::1]", "x"], {}, 2, "PR105"),
    ("server starting with dash", ["plan", "--vipu-server-host", "-oX", "x"], {}, 2, "PR105"),
    ("server with space", ["plan", "s.pop"], {"s.pop": "partition p at 'a b'\nrun x\n"}, 2, "PR105"),
    ("dsl run with a number", ["plan", "s.pop"], {"s.pop": 'run ["a", 1]\n'}, 2, "PR105"),
    ("dsl run with null", ["plan", "s.pop"], {"s.pop": 'run ["a", null]\n'}, 2, "PR105"),
    ("dsl run of the test command", ["plan", "s.pop"], {"s.pop": "run [ -f x ]\n"}, 0, None),
    ("nul escape in toml argv", ["plan", "s.toml"], {"s.toml": '[program]\nargv = ["a\\u0000b"]\n'}, 2, "PR105"),
    ("nul escape in toml env", ["plan", "s.toml"], {"s.toml": '[env]\nset = { A = "\\u0000" }\n' + TOML_RUN}, 2,
     "PR105"),
    ("nul escape in dsl set", ["plan", "s.pop"], {"s.pop": 'set A = "a\\u0000b"\nrun x\n'}, 2, "PR105"),
    ("empty cwd in toml", ["plan", "s.toml"], {"s.toml": '[program]\nargv = ["x"]\ncwd = ""\n'}, 2, "PR105"),
    ("empty cwd in dsl", ["plan", "s.pop"], {"s.pop": 'cd ""\nrun x\n'}, 2, "PR105"),
    ("empty program name", ["plan", "s.toml"], {"s.toml": '[program]\nargv = [""]\n'}, 2, "PR105"),
    ("empty program name on the command line", ["plan", "--", ""], {}, 2, "PR105"),
    ("mask of a bad name", ["plan", "--mask", "A-B", "x"], {}, 2, "PR105"),
    ("mask empty", ["plan", "--mask", "", "x"], {}, 2, "PR105"),
    ("mask in env", ["plan", "x"], {"env:POPRUN_MASK": "1A"}, 2, "PR105"),
    ("explain after the program", ["plan", "python3", "x.py", "--explain"], {}, 0, "PR218"),
    ("format after the program", ["plan", "python3", "x.py", "--format=json"], {}, 0, "PR218"),
    ("saved plan with an option", ["plan", "p.json", "--num-replicas", "2"], {"p.json": "{}"}, 2, "PR114"),
    ("saved plan not json", ["apply", "p.json"], {"p.json": "not json"}, 2, "PR114"),
    ("saved plan a list", ["apply", "p.json"], {"p.json": "[]"}, 2, "PR114"),
    ("saved plan version true", ["apply", "p.json"], {"p.json": '{"format_version": true}'}, 2, "PR114"),
    ("saved plan version float", ["apply", "p.json"], {"p.json": '{"format_version": 1.0}'}, 2, "PR114"),
    ("saved plan version string", ["apply", "p.json"], {"p.json": '{"format_version": "1"}'}, 2, "PR114"),
    ("saved plan deeply nested", ["apply", "p.json"], {"p.json": "[" * 100000 + "]" * 100000}, 2, "PR114"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_input_gets_a_diagnostic_or_a_visible_plan(case, tmp_path, monkeypatch):
    """The exit status and first diagnostic are as expected; no traceback; an accepted plan shows its program."""
    _, argv, files, status, code = case
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("POPRUN_")]:
        monkeypatch.delenv(name)
    for name, content in files.items():
        if name.startswith("env:"):
            monkeypatch.setenv(name[4:], str(content))
        elif isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        else:
            (tmp_path / name).write_text(content, encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        result = main(argv)
    first = err.getvalue().split("]", 1)[0].rpartition("[")[2] if "[PR" in err.getvalue().split("\n")[0] else None

    assert "internal error" not in err.getvalue()
    assert (status, code) == (result, first), err.getvalue()
    if result == 0 and "--format=json" not in argv:
        assert "program: " in out.getvalue()
