"""Records: attrs.frozen's semantics, made without generated code."""

from __future__ import annotations

import pickle
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.core.record import FrozenRecordError, evolve, field, fields, positional_record, record


@record
class Point:
    """A keyword-only record with a default, a factory and a field left out of equality."""

    x: int
    y: int = 0
    tags: list[str] = field(factory=list)
    note: str = field(default="", eq=False)
    kind: ClassVar[str] = "point"


@positional_record
class Pair:
    """A record that also takes its fields by position."""

    first: str
    second: int = 2


@record
class Point3(Point):
    """A record that inherits fields."""

    z: int = 0


@record
class Checked:
    """A record whose __post_init__ checks and normalises."""

    name: str

    def __post_init__(self) -> None:
        if not self.name:
            msg = "empty name"
            raise ValueError(msg)
        object.__setattr__(self, "name", self.name.lower())


def test_keyword_init_defaults_and_factories() -> None:
    """Defaults fill what is not given; a factory gives each instance its own value."""
    a, b = Point(x=1), Point(x=1)

    assert (1, 0, [], "") == (a.x, a.y, a.tags, a.note)
    assert a.tags is not b.tags
    assert "point" == Point.kind
    assert ["x", "y", "tags", "note"] == [f.name for f in fields(Point)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: Point(1), "takes no positional arguments"),  # type: ignore[misc]
    (lambda: Point(y=1), "missing required arguments: 'x'"),  # type: ignore[call-arg]
    (lambda: Point(x=1, z=2), "unexpected keyword argument 'z'"),  # type: ignore[call-arg]
    (lambda: Pair("a", 1, 2), "takes at most 2 positional arguments"),  # type: ignore[call-arg]
    (lambda: Pair("a", first="b"), "multiple values for 'first'"),  # type: ignore[misc]
])
def test_wrong_arguments_are_type_errors(call: object, message: str) -> None:
    """Calls a dataclass would refuse are refused, with the same kind of message."""
    with pytest.raises(TypeError, match=message):
        call()  # type: ignore[operator]


def test_positional_init_and_match_args() -> None:
    """positional_record takes fields in order and supports match by position."""
    pair = Pair("a")

    assert ("a", 2) == (pair.first, pair.second)
    match pair:
        case Pair(first, second):
            assert ("a", 2) == (first, second)


def test_immutable() -> None:
    """Assigning or deleting a field raises, and says to use evolve."""
    point = Point(x=1)

    with pytest.raises(FrozenRecordError, match="use evolve"):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del point.y  # type: ignore[misc]


def test_equality_hash_and_repr_leave_out_eq_false_fields() -> None:
    """note (eq=False) does not count; the class does; repr shows the compared fields."""
    assert Point(x=1, note="a") == Point(x=1, note="b")
    assert hash(Point(x=1, y=2, tags=())) == hash(Point(x=1, y=2, tags=()))  # type: ignore[arg-type]
    assert Point(x=1) != Point3(x=1)
    assert Point(x=1) != (1, 0)
    assert "Point(x=1, y=0, tags=[])" == repr(Point(x=1, note="hidden"))


def test_inheritance_puts_base_fields_first() -> None:
    """A record subclass has its bases' fields, then its own."""
    assert ["x", "y", "tags", "note", "z"] == [f.name for f in fields(Point3)]
    assert 3 == Point3(x=1, z=3).z


def test_post_init_checks_and_normalises() -> None:
    """__post_init__ runs after every init, evolve included."""
    assert "ab" == Checked(name="AB").name
    assert "cd" == evolve(Checked(name="ab"), name="CD").name
    with pytest.raises(ValueError, match="empty name"):
        Checked(name="")


def test_evolve_refuses_unknown_fields_and_fields_refuses_other_classes() -> None:
    """evolve(x, bogus=1) and fields(int) are TypeErrors."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        evolve(Point(x=1), bogus=1)
    with pytest.raises(TypeError, match="not a record class"):
        fields(int)


@given(x=st.integers(), y=st.integers(), tags=st.lists(st.text(max_size=3), max_size=3), note=st.text(max_size=5))
def test_evolve_and_pickle_round_trip(x: int, y: int, tags: list[str], note: str) -> None:
    """evolve with no change and a pickle round trip both give an equal record, note included."""
    point = Point(x=x, y=y, tags=tags, note=note)

    copied = pickle.loads(pickle.dumps(point))  # noqa: S301 - our own bytes

    assert point == evolve(point) == copied
    assert note == copied.note
    assert Point(x=x + 1, y=y, tags=tags) == evolve(point, x=x + 1)
