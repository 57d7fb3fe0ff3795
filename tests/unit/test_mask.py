"""Values of secret-looking variables and of --mask variables are masked in explain, diff and every text output."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from poprun.cli.main import main
from poprun.planner.environment import is_secret


def _run(argv, monkeypatch=None, env=None):
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MYSQL_PASSWD", "GH_AUTH",
                                  "HTTP_AUTHORIZATION", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CREDENTIAL",
                                  "SSH_PRIVATE", "GPG_PASSPHRASE", "SESSION_COOKIE", "wandb_api_key"])
def test_secret_looking_names_are_masked(name):
    """Names holding a secret word (any case) are masked."""
    assert is_secret(name)


@pytest.mark.parametrize("name", ["PATH", "PYTHONPATH", "OMP_NUM_THREADS", "HOME", "XDG_SESSION_ID"])
def test_ordinary_names_are_shown(name):
    """Ordinary names are not masked (SESSION alone is not a secret word)."""
    assert not is_secret(name)


def test_mask_names_a_variable_to_mask():
    """A name in the mask is masked whatever it looks like."""
    assert is_secret("DB_URL", ("DB_URL",))


SECRET = "hunter2-value"  # noqa: S105 - a value to look for in the output


@pytest.mark.parametrize("how", ["flag", "repeated", "env", "toml", "dsl"])
def test_mask_hides_the_value_in_explain(how, tmp_path, monkeypatch):
    """--mask (or POPRUN_MASK, [env] mask, the DSL's mask) hides DB_URL's value in explain, and is recorded."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(f'[env]\nmask = ["DB_URL"]\nset = {{ DB_URL = "{SECRET}" }}\n'
                                     '[program]\nargv = ["python3"]\n')
    (tmp_path / "s.pop").write_text(f"mask DB_URL\nset DB_URL = {SECRET}\nrun python3\n")
    x = f"--mpi-local-args=-x DB_URL={SECRET}"
    argv = {"flag": ["plan", "--explain", "--mask", "DB_URL,OTHER", x, "python3"],
            "repeated": ["plan", "--explain", "--mask", "OTHER", "--mask=DB_URL", x, "python3"],
            "env": ["plan", "--explain", x, "python3"],
            "toml": ["plan", "--explain", "s.toml"], "dsl": ["plan", "--explain", "s.pop"]}[how]

    status, out, err = _run(argv, monkeypatch, {"POPRUN_MASK": "DB_URL"} if how == "env" else {})

    assert (0, "") == (status, err)
    assert SECRET not in out
    assert "DB_URL=********" in out
    assert "mask " in out  # the decision, with its source


def test_saved_plan_keeps_the_mask_for_explain_and_diff(tmp_path, monkeypatch):
    """The mask is in the plan: explain and diff (text and JSON) of the saved plan mask the value too."""
    monkeypatch.chdir(tmp_path)
    status, out, _ = _run(["plan", "--format", "json", "--mask", "DB_URL", f"--mpi-local-args=-x DB_URL={SECRET}",
                           "python3"])
    assert 0 == status
    assert ["DB_URL"] == json.loads(out)["mask"]
    (tmp_path / "plan.json").write_text(out)

    outputs = [_run(["plan", "--explain", "plan.json"]),
               _run(["plan", "--diff", "plan.json", "--mpi-local-args=-x DB_URL=other", "python3"]),
               _run(["plan", "--diff", "plan.json", "--format", "json", "--mpi-local-args=-x DB_URL=other", "python3"])]

    assert [0, 0, 0] == [status for status, _, _ in outputs]
    assert not any(SECRET in text or "other" in text.replace("other instances", "") for _, text, _ in outputs)
    assert all("********" in text for _, text, _ in outputs)


def test_json_diff_masks_secret_looking_names(tmp_path, monkeypatch):
    """plan --diff --format json masks a TOKEN's values, as the text diff does."""
    monkeypatch.chdir(tmp_path)
    _, out, _ = _run(["plan", "--format", "json", "--mpi-local-args=-x MY_TOKEN=abc123", "python3"])
    (tmp_path / "plan.json").write_text(out)

    status, diff, _ = _run(["plan", "--diff", "plan.json", "--format", "json", "--mpi-local-args=-x MY_TOKEN=zz9",
                            "python3"])

    assert 0 == status
    assert "abc123" not in diff
    assert "zz9" not in diff


def test_mask_of_a_bad_name_is_a_diagnostic():
    """--mask takes variable names: anything else is PR105."""
    status, _, err = _run(["plan", "--mask", "A-B", "python3"])

    assert 2 == status
    assert "error[PR105]" in err


def test_debug_log_masks_the_values_of_masked_and_secret_looking_names(tmp_path):
    """poprun -vv logs each instance's environment: --mask names and secret-looking names show ****, not values."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "-vv", "--mask", "PLAIN_NAME",
                           "--mpi-local-args=-x PLAIN_NAME=visible-value-1 -x DB_PASSWD=visible-value-2",
                           "--num-instances", "1", "--num-replicas", "2", "--offline-mode=1", "true"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    assert "PLAIN_NAME=****" in done.stderr
    assert "visible-value" not in done.stdout + done.stderr


@pytest.mark.parametrize(("text", "shown"), [
    ("DB_URL=postgres://u:pw@h/db", "DB_URL=postgres://u:****@h/db"),
    ("'postgres://u:p@ss@h:5432/db?x=1' next", "'postgres://u:****@h:5432/db?x=1' next"),
    ("redis://:secret@r:6379/0", "redis://:****@r:6379/0"),
    ("mongodb+srv://me:x%40y@c.net/db", "mongodb+srv://me:****@c.net/db"),
    ("a https://u:1@a/ and ftp://v:2@b", "a https://u:****@a/ and ftp://v:****@b"),
    ("http://h:8080/a@b", "http://h:8080/a@b"),  # a port, and an @ in the path: no password
    ("https://token@github.com/x", "https://token@github.com/x"),  # a user, no password: --mask names such variables
    ("x://u:@h", "x://u:@h"),
    ("no url: u:pw@h", "no url: u:pw@h"),
])
def test_mask_urls_hides_every_url_password_and_nothing_else(text, shown):
    """Only the password part of scheme://user:password@host is replaced."""
    from poprun.core.secret import mask_urls

    assert shown == mask_urls(text)


@pytest.mark.parametrize(("text", "shown"), [
    ("poprun plan '--mpi-local-args=-x API_TOKEN=abc123' -q", "poprun plan '--mpi-local-args=-x API_TOKEN=****' -q"),
    ("python3 x.py --password=hunter2 --epochs=3", "python3 x.py --password=**** --epochs=3"),
    ("x '--password=a b' y", "x '--password=****' y"),
    ('a=b KEY="x y" z', "a=b KEY=**** z"),
    ("SET=1 OTHER=2", "SET=**** OTHER=2"),  # SET is in the plan's mask
    ("  HF_TOKEN=********", "  HF_TOKEN=********"),
    ("python3 x.py --password hunter2", "python3 x.py --password hunter2"),  # a separate word: not recognised
])
def test_mask_text_hides_values_of_secret_looking_assignments(text, shown):
    """NAME=VALUE words whose name looks secret (or is masked) show ****, wherever they stand in a line."""
    from poprun.core.secret import mask_text

    assert shown == mask_text(text, ("SET",))
