"""
Records: the immutable value classes of poprun's spec, plan and results.

Layer: ``poprun.core``; the standard library only, and nothing of it at run time.

A record is what ``attrs.frozen`` makes, without its cost: attrs (like ``dataclasses``)
builds each class by generating and compiling source code, about 0.8 ms a class, and attrs
itself takes some 20 ms to import. A classic ``poprun program`` builds about 30 model classes
before it starts the first instance, and its whole start-up budget is twice a bare
``python3 -c pass`` (``bench/apply_bench.py`` measures it), which leaves room for neither. A
record class is made in some 20 microseconds, from closures. Type checkers see records as
dataclasses (PEP 681), so constructors are checked as attrs' are.

Semantics, those of ``attrs.frozen``:

- The fields are the class's annotations, in order (record bases' fields first; ``ClassVar``
  annotations are not fields). A class attribute is the field's default;
  ``field(factory=list)`` makes a new default each time; ``field(eq=False)`` leaves a field
  out of equality, hashing and the repr (a source position beside a value, say).
- ``__init__`` takes the fields by keyword; with ``positional_record`` also by position.
  A method ``__post_init__`` runs after it, to check or normalise values (use
  ``object.__setattr__`` there).
- Instances are immutable (:class:`FrozenRecordError`), equal when their class and fields
  are, hashable, printed as ``Name(a=1, b='x')``, and picklable.
- :func:`evolve` returns a copy with some fields changed; :func:`fields` lists the fields.
"""

from __future__ import annotations

import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    T = TypeVar("T")
else:
    def dataclass_transform(**_: object) -> object:  # noqa: D103 - what typing's does at run time
        return lambda function: function

_MISSING = object()
_FIELDS = "__record_fields__"


class Generic:
    """
    ``typing.Generic`` at run time, where only type checkers need it.

    A generic record imports the real one under ``TYPE_CHECKING`` and this one otherwise:
    ``class Sourced(Generic[T])`` derives from this class, and ``Sourced[int]`` is a
    ``types.GenericAlias``, as ``list[int]`` is.
    """

    def __class_getitem__(cls, params: object) -> object:
        return cls if cls is Generic else types.GenericAlias(cls, params)


class FrozenRecordError(AttributeError):
    """A record's field was assigned or deleted."""


class Field:
    """One field of a record class: its name, default or factory, and whether it counts in equality."""

    __slots__ = ("default", "eq", "factory", "name")

    def __init__(self, name: str, default: object = _MISSING, factory: Callable[[], object] | None = None,
                 *, eq: bool = True) -> None:
        self.name = name
        self.default = default
        self.factory = factory
        self.eq = eq

    @property
    def required(self) -> bool:
        """Whether ``__init__`` needs a value for this field."""
        return self.default is _MISSING and self.factory is None

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


class _Spec:
    """What ``field()`` leaves in a class body, until the record decorator reads it."""

    __slots__ = ("default", "eq", "factory")

    def __init__(self, default: object, factory: Callable[[], object] | None, eq: bool) -> None:
        self.default = default
        self.factory = factory
        self.eq = eq


def field(*, default: Any = _MISSING, factory: Callable[[], Any] | None = None, eq: bool = True) -> Any:
    """Declare a field with a default, a default ``factory``, or left out of equality (``eq=False``)."""
    return _Spec(default, factory, eq)


def fields(cls: type) -> tuple[Field, ...]:
    """Return the fields of record class ``cls``, in order."""
    found: tuple[Field, ...] | None = getattr(cls, _FIELDS, None)
    if found is None:
        msg = f"{cls.__qualname__} is not a record class"
        raise TypeError(msg)
    return found


def evolve(instance: T, **changes: Any) -> T:
    """Return a copy of record ``instance`` with ``changes``; unknown names are a TypeError."""
    values = {f.name: getattr(instance, f.name) for f in fields(type(instance))}
    return type(instance)(**(values | changes))


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(field,))
def record(cls: type[T]) -> type[T]:
    """Make ``cls`` a record whose ``__init__`` takes keywords only."""
    return _build(cls, positional=False)


@dataclass_transform(kw_only_default=False, frozen_default=True, field_specifiers=(field,))
def positional_record(cls: type[T]) -> type[T]:
    """Make ``cls`` a record whose ``__init__`` also takes the fields by position, in order."""
    return _build(cls, positional=True)


def _build(cls: type[T], *, positional: bool) -> type[T]:
    inherited: tuple[Field, ...] = getattr(cls, _FIELDS, ())
    own: list[Field] = []
    annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - inspect costs 6 ms to import
    for name, annotation in annotations.items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, _Spec):
            own.append(Field(name, value.default, value.factory, eq=value.eq))
            if value.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value.default)
        else:
            own.append(Field(name, value))
    all_fields = tuple(f for f in inherited if f.name not in {o.name for o in own}) + tuple(own)
    setattr(cls, _FIELDS, all_fields)
    names = tuple(f.name for f in all_fields)
    compared = tuple(f.name for f in all_fields if f.eq)
    methods = {"__init__": _init(cls.__qualname__, all_fields, positional=positional),
               "__setattr__": _frozen, "__delattr__": _frozen, "__eq__": _eq(compared), "__hash__": _hash(compared),
               "__repr__": _repr(compared), "__reduce__": _reduce(names),
               "__match_args__": names if positional else ()}
    for name, method in methods.items():
        setattr(cls, name, method)
    return cls


def _init(qualname: str, all_fields: tuple[Field, ...], *, positional: bool) -> Callable[..., None]:
    names = tuple(f.name for f in all_fields)
    known = frozenset(names)
    required = tuple(f.name for f in all_fields if f.required)
    defaults = tuple((f.name, f.default, f.factory) for f in all_fields if not f.required)
    setter = object.__setattr__

    def __init__(self: object, *args: object, **kwargs: object) -> None:  # noqa: N807
        if args:
            if not positional or len(args) > len(names):
                msg = f"{qualname}() takes {'at most ' + str(len(names)) if positional else 'no'} positional arguments"
                raise TypeError(msg)
            for name, value in zip(names, args, strict=False):
                if name in kwargs:
                    msg = f"{qualname}() got multiple values for {name!r}"
                    raise TypeError(msg)
                kwargs[name] = value
        if not known.issuperset(kwargs):
            msg = f"{qualname}() got an unexpected keyword argument {min(set(kwargs) - known)!r}"
            raise TypeError(msg)
        missing = [name for name in required if name not in kwargs]
        if missing:
            msg = f"{qualname}() missing required arguments: {', '.join(map(repr, missing))}"
            raise TypeError(msg)
        for name, default, factory in defaults:
            if name not in kwargs:
                kwargs[name] = factory() if factory is not None else default
        for name in names:
            setter(self, name, kwargs[name])
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()

    return __init__


def _frozen(self: object, name: str, *_: object) -> None:
    msg = f"cannot change {name!r} of {type(self).__qualname__}: records are immutable (use evolve)"
    raise FrozenRecordError(msg)


def _eq(compared: tuple[str, ...]) -> Callable[[object, object], bool]:
    def __eq__(self: object, other: object) -> bool:  # noqa: N807
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in compared)

    return __eq__


def _hash(compared: tuple[str, ...]) -> Callable[[object], int]:
    def __hash__(self: object) -> int:  # noqa: N807
        return hash((self.__class__, *(getattr(self, name) for name in compared)))

    return __hash__


def _repr(compared: tuple[str, ...]) -> Callable[[object], str]:
    def __repr__(self: object) -> str:  # noqa: N807
        inside = ", ".join(f"{name}={getattr(self, name)!r}" for name in compared)
        return f"{self.__class__.__qualname__}({inside})"

    return __repr__


def _reduce(names: tuple[str, ...]) -> Callable[[object], tuple[object, ...]]:
    def __reduce__(self: object) -> tuple[object, ...]:  # noqa: N807
        return _rebuild, (self.__class__, tuple((name, getattr(self, name)) for name in names))

    return __reduce__


def _rebuild(cls: type[T], items: tuple[tuple[str, object], ...]) -> T:
    return cls(**dict(items))
