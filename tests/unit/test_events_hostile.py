"""Reading events written by someone else: data that is not an event is None, never an exception."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.core import events

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)
KINDS = sorted(events._KINDS)  # every kind this poprun knows
EVERY_EVENT = [
    events.InstanceStarted(index=0, pid=12), events.InstanceEnded(index=1, pid=13, signal=9, stopped=True),
    events.PartitionAcquiring(partition="p"), events.PartitionAcquired(), events.PartitionReleased(partition="p"),
    events.LaunchStarting(backend="local", instances=2, variables=(("A", "1"),), cache="/tmp/c"),
    events.LaunchRunning(), events.Stopping(reason="instance 1 failed"), events.LaunchEnded(statuses=(0, 3), root_cause=1),
    events.RunStarted(run="20261125-000000-abcdef", backend="ssh", instances=2, hosts=("h1", "h2")),
    events.InstanceOutputTruncated(index=0, kept=10), events.Teardown(), events.RunEnded(status=3, root_cause=1),
    events.HostChecked(host="h1", ok=True),
    events.HealthChecked(host="h1", ok=True, outcome="passed", status=0, ms=12, tail=("fine",)),
    events.HealthChecked(host="h2", ok=False, outcome="unreachable", reason="PR405: host name not known"),
    events.HostConnected(host="h1", ms=120),
    events.PhaseEnded(phase="first-output", ms=310),
    events.AttemptStarted(attempt=0), events.AttemptEnded(attempt=0, status=0),
    events.Replan(attempt=1, removed=("h2",)),
    events.LimitReached(limit="stall", after_ms=1), events.StacksCollected(instances=()),
    events.MpiWithoutLauncher(index=1, library="/usr/lib/libmpi.so.40"),
    events.InstanceProgressed(index=1, host="h2", attempt=0, step=1.5, total=None, metrics=(("x", "y"), ("z", None))),
]


@pytest.mark.parametrize("data", [None, [], "launch-running", 5, {"v": 1, "event": ["x"]}, {"v": 1, "event": {"a": 1}},
                                  {"v": True, "event": "launch-running"}, {"v": 1.0, "event": "launch-running"},
                                  {"v": 1, "event": "instance-started"},
                                  {"v": 1, "event": "instance-started", "index": "a", "pid": None},
                                  {"v": 1, "event": "instance-started", "index": True, "pid": 1},
                                  {"v": 1, "event": "instance-ended", "index": 0, "pid": 1, "signal": "x"},
                                  {"v": 1, "event": "instance-ended", "index": 0, "pid": 1, "lost": 1},
                                  {"v": 1, "event": "launch-ended", "statuses": 5},
                                  {"v": 1, "event": "launch-ended", "statuses": [[1], {"a": 1}]},
                                  {"v": 1, "event": "launch-starting", "backend": "x", "instances": 1, "variables": "ab"},
                                  {"v": 1, "event": "launch-starting", "backend": "x", "instances": 1, "variables": [["a"]]},
                                  {"v": 1, "event": "stopping", "reason": None}])
def test_data_that_is_not_an_event_reads_as_none(data):
    """Wrong types, missing fields, a version that is a bool or a float: None, not an exception or a bad event."""
    assert events.from_dict(data) is None


@given(kind=st.sampled_from(KINDS), data=st.dictionaries(st.text(max_size=12), JSON, max_size=6), v=st.just(1) | JSON)
def test_from_dict_never_raises(kind, data, v):
    """Any JSON object, of any known kind: an event whose fields have their declared types, or None."""
    read = events.from_dict({**data, "v": v, "event": kind})

    assert read is None or events.from_dict(json.loads(json.dumps(events.to_dict(read)))) == read


@pytest.mark.parametrize("event", EVERY_EVENT, ids=lambda e: e.kind)
def test_every_event_survives_json_with_extra_fields(event):
    """An event's JSON read back is the event; fields this poprun does not know are skipped, and huge ints kept."""
    data = json.loads(json.dumps(events.to_dict(event)))

    assert event == events.from_dict({**data, "added_later": [1, {"x": None}]})
    assert events.InstanceStarted(index=10**30, pid=1) == events.from_dict(
        {"v": 1, "event": "instance-started", "index": 10**30, "pid": 1})


def test_every_kind_is_covered():
    """The test events hold one of every kind this poprun knows."""
    assert KINDS == sorted({e.kind for e in EVERY_EVENT})


def test_every_field_of_every_event_has_a_type_check():
    """from_dict knows how to check each field's declared type, so a new field is never read unchecked."""
    from poprun.core.record import fields

    for cls in events._KINDS.values():
        for field in fields(cls):
            assert cls.__annotations__[field.name] in events._TYPES, (cls.kind, field.name)
