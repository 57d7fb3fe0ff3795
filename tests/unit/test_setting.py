"""The settings table: checks, the planned settings of a backend, and the docs and help made from it."""

from pathlib import Path

import pytest

from poprun.cli.helptext import render_help
from poprun.planner.plan import BackendSetting
from poprun.planner.setting import SETTINGS, Setting, backend_rows, plan_settings, render_settings_doc, setting

DOCS = Path(__file__).parents[2] / "docs" / "settings.md"


def test_docs_settings_md_is_made_from_the_table():
    """docs/settings.md is exactly what the table renders (regenerate it with render_settings_doc)."""
    expected = render_settings_doc()

    assert expected == DOCS.read_text(encoding="utf-8")


def test_help_lists_every_setting():
    """poprun --help ends with a settings section naming every row of the table."""
    text = render_help()
    section = text[text.index("Settings (environment variables"):]

    assert [] == [s.name for s in SETTINGS if f"  {s.name} " not in section]


def test_every_poprun_variable_read_in_the_code_is_a_setting_or_not_one_on_purpose():
    """Each POPRUN_* name spelled in poprun's code is a setting, an option's fallback, or a known non-setting."""
    import re

    from poprun.planner.option import OPTIONS

    fallbacks = {"POPRUN_" + o.name.removeprefix("--").replace("-", "_").upper() for o in OPTIONS}
    known = {"POPRUN_EVENTS", "POPRUN_SLURM_LAUNCH", "POPRUN_OUTPUT_RELAY", "POPRUN_SSH_COPY_ID_SECRET",
             "POPRUN_RUN_ID", "POPRUN_RESTART_COUNT", "POPRUN_PRE_RESTART_MARK", "POPRUN_UPDATE_GOLDEN",
             "POPRUN_HEALTH_TOKEN", "POPRUN_HEALTH_END",  # the health check's marks on a host (poprun.apply.health)
             "POPRUN_PROGRESS", "POPRUN_PROGRESS_TOKEN",  # the progress channel, set by apply (docs/progress.md)
             # what the notify command's shell is given (poprun.apply.notify): the command, the event's kind, a mark
             "POPRUN_NOTIFY_COMMAND", "POPRUN_NOTIFY_EVENT", "POPRUN_NOTIFY_MARK"}
    root = Path(__file__).parents[2] / "poprun"
    spelled = {m for f in root.rglob("*.py") for m in re.findall(r"POPRUN_[A-Z][A-Z_]*[A-Z]", f.read_text())}

    assert [] == sorted(spelled - {s.name for s in SETTINGS} - fallbacks - known)


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("POPRUN_SSH_FANOUT", "", "auto"), ("POPRUN_SSH_FANOUT", " 016 ", "16"), ("POPRUN_SSH_FANOUT", "1024", "1024"),
    ("POPRUN_SSH_RELAY", "ON", "on"), ("POPRUN_SSH_RELAY", "", "auto"),
    ("POPRUN_HOST_TIMEOUT", "3", "3"), ("POPRUN_HOST_TIMEOUT", "2.5e1", "2.5e1"), ("POPRUN_SSH_CONFIG", "cfg", "cfg"),
    ("POPRUN_STRAGGLER_FACTOR", " 2 ", "2"), ("POPRUN_STRAGGLER_FACTOR", "1.25", "1.25"),
    ("POPRUN_STRAGGLER_FACTOR", "4.0", "4"), ("POPRUN_STRAGGLER_WINDOW", "050", "50"),
])
def test_a_setting_reads_what_its_backend_took_from_the_environment(name, text, expected):
    """A planned setting's value is the text its backend read before (blank: the default)."""
    assert expected == setting(name).check(text)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("POPRUN_SSH_FANOUT", "abc", "POPRUN_SSH_FANOUT='abc' is not a whole number of connections from 1 to 1024"),
    ("POPRUN_SSH_FANOUT", "\u00b2", "POPRUN_SSH_FANOUT='\u00b2' is not a whole number of connections from 1 to 1024"),
    ("POPRUN_SSH_FANOUT", "0", "POPRUN_SSH_FANOUT='0' is not a whole number of connections from 1 to 1024"),
    ("POPRUN_SSH_FANOUT", "auto", "POPRUN_SSH_FANOUT='auto' is not a whole number of connections from 1 to 1024"),
    ("POPRUN_SSH_RELAY", "sometimes", "POPRUN_SSH_RELAY='sometimes' is not one of auto, on, off"),
    ("POPRUN_HOST_TIMEOUT", "nan", "POPRUN_HOST_TIMEOUT='nan' is not a number of seconds from 3 to 3600"),
    ("POPRUN_HOST_TIMEOUT", "3601", "POPRUN_HOST_TIMEOUT='3601' is not a number of seconds from 3 to 3600"),
    ("POPRUN_STRAGGLER_FACTOR", "1", "POPRUN_STRAGGLER_FACTOR='1' is not a number from 1.05 to 1000"),
    ("POPRUN_STRAGGLER_FACTOR", "nan", "POPRUN_STRAGGLER_FACTOR='nan' is not a number from 1.05 to 1000"),
    ("POPRUN_STRAGGLER_FACTOR", "inf", "POPRUN_STRAGGLER_FACTOR='inf' is not a number from 1.05 to 1000"),
    ("POPRUN_STRAGGLER_WINDOW", "1", "POPRUN_STRAGGLER_WINDOW='1' is not a whole number of steps from 2 to 10000"),
    ("POPRUN_STRAGGLER_WINDOW", "1e3", "POPRUN_STRAGGLER_WINDOW='1e3' is not a whole number of steps from 2 to 10000"),
])
def test_a_bad_value_says_what_the_setting_takes(name, text, message):
    """A value a setting does not take raises with the message the backend gave at launch before."""
    with pytest.raises(ValueError) as raised:
        setting(name).check(text)

    assert message == str(raised.value)


def test_the_ssh_backend_plans_its_four_settings_and_the_straggler_rule_with_their_sources():
    """The ssh backend's settings come from the environment when set, else their defaults, sorted by name."""
    values, problems = plan_settings(backend_rows("ssh"), {"POPRUN_SSH_FANOUT": "16", "POPRUN_SSH_RELAY": " "})

    assert () == problems
    assert (BackendSetting(name="POPRUN_HOST_TIMEOUT", value="15", source="default"),
            BackendSetting(name="POPRUN_SSH_CONFIG", value="", source="default"),
            BackendSetting(name="POPRUN_SSH_FANOUT", value="16", source="environment variable POPRUN_SSH_FANOUT"),
            BackendSetting(name="POPRUN_SSH_RELAY", value="auto", source="default"),
            BackendSetting(name="POPRUN_STRAGGLER_FACTOR", value="1.5", source="default"),
            BackendSetting(name="POPRUN_STRAGGLER_WINDOW", value="20", source="default")) == values


STRAGGLER_ROWS = ("POPRUN_STRAGGLER_FACTOR", "POPRUN_STRAGGLER_WINDOW")


def test_backends_without_settings_plan_only_the_straggler_rule_and_a_plugin_plans_its_own():
    """The local backend reads no planned setting (apply's straggler rule is planned for all); a plugin's declared rows are planned for it."""
    row = Setting("POPRUN_DEMO_SLOTS", "count", "1-8", "2", "demo plugin", "slots per host", unit="slots")

    assert STRAGGLER_ROWS == tuple(r.name for r in backend_rows("local"))
    assert (row, *(setting(n) for n in STRAGGLER_ROWS)) == backend_rows("demo", (row,))
    values, problems = plan_settings((row,), {"POPRUN_DEMO_SLOTS": "9"})
    assert () == values
    assert ["PR225"] == [d.code for d in problems]
    assert "POPRUN_DEMO_SLOTS='9' is not a whole number of slots from 1 to 8" == problems[0].detail


def test_an_unplanned_setting_is_read_through_the_table_as_it_is_set():
    """setting_value gives the text as set (None unset); a name the table lacks is a programmer's KeyError."""
    from poprun.planner.setting import setting_value

    environ = {"POPRUN_HOST_TOPOLOGY": " pod.json ", "POPRUN_SOMETHING": "x"}

    assert (" pod.json ", None) == (setting_value("POPRUN_HOST_TOPOLOGY", environ),
                                    setting_value("POPRUN_PARTITION_PROVIDER", environ))
    with pytest.raises(KeyError):
        setting_value("POPRUN_SOMETHING", environ)
