"""The stacks script's output, parsed: hex fields cannot forge records, a cut answer is said to be cut."""

from __future__ import annotations

import pytest

from poprun.apply.stacks import FAULTHANDLER, parse_stacks, stacks_script


def hexed(text: str) -> str:
    return text.encode().hex()


def test_a_hostile_name_and_stack_stay_inside_their_records():
    """A process name and a py-spy dump holding newlines and record words are shown, never parsed as records."""
    # GIVEN
    stat = "77 (a\nproc 9 5 00 00) S 1 2 3"
    stack = "Thread 1\n    hang_here (x.py:3)\nproc 10 6 00 00\n@done"
    text = "\n".join([f"proc 77 0 {hexed(stat)} {hexed('do_wait')}", f"stack 77 {hexed(stack)}",
                      "proc 78 0 zz", "note 77 faulthandler", "@done", ""])

    # WHEN
    found, whole = parse_stacks(text)

    # THEN
    assert whole
    assert [0] == list(found)
    assert [("pid 77 (a?proc 9 5 00 00), state S (sleeping), waiting in do_wait\n  Thread 1\n      hang_here (x.py:3)\n"
             f"  proc 10 6 00 00\n  @done\n  {FAULTHANDLER}")] == found[0]


def test_an_answer_without_its_end_is_not_whole():
    """No @done: the host did not finish (cut by the time limit or the connection)."""
    assert ({}, False) == parse_stacks("proc 1 0 zz\n")


@pytest.mark.parametrize("run_id", ["", "a b", "x'y", "$(id)", "-rf", "a\nb", "é"])
def test_only_run_ids_reach_the_script(run_id):
    """Anything but letters, digits and ._:+- (first a letter or digit) is refused before a script is made."""
    with pytest.raises(ValueError, match="is not a run id"):
        stacks_script(run_id, (0,))


def test_the_script_holds_the_run_id_quoted_and_numbers_only():
    """The run id is shell-quoted; the instances and the pid to spare are numbers."""
    script = stacks_script("20261125-021453-ab12", (0, 3), skip_pid=42)

    assert "__poprun_id=20261125-021453-ab12;" in script
    assert '__poprun_want=" 0 3 "' in script
    assert "__poprun_skip=42" in script
