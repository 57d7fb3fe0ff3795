"""Laws of the health check's host script: the command reaches the host's shell byte for byte; kept lines are bounded."""

from __future__ import annotations

import os
import subprocess

from hypothesis import given
from hypothesis import strategies as st

from poprun.apply import health

COMMANDS = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), max_size=40) | st.sampled_from(
    ["it's", "$(id)", "`id`", "a\nb", "x; y", '"', "\\", "'\"'\"'", "EOF\n)", "${x:-y}"])


@given(COMMANDS)
def test_the_command_arrives_unchanged_in_the_hosts_shell(command):
    """The script's first lines, run by sh, hold exactly the command in $__poprun_hc (quotes, $(), newlines, ...)."""
    head = health.host_script(command, 1, begin="b", end="e", mark="m").split("__poprun_kill() {")[0]

    done = subprocess.run(["sh", "-s"], input=(head + 'printf %s "$__poprun_hc"\n').encode(), capture_output=True,
                          check=False, env={"PATH": os.defpath})

    assert command.encode() == done.stdout


@given(st.binary(max_size=3000))
def test_kept_lines_are_few_short_and_printable(tail):
    """Whatever a check prints: at most TAIL_LINES lines, each printable and at most LINE_CHARS long."""
    lines = health._lines(tail, ())

    assert len(lines) <= health.TAIL_LINES
    assert all(line.isprintable() and 0 < len(line) <= health.LINE_CHARS for line in lines)
