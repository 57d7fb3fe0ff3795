"""
The LaunchPlan as versioned, deterministic JSON, and back.

Layer: ``poprun.planner``; imports cattrs and the plan model.

Same plan, same bytes: keys are sorted, lists keep their order. An instance's ``env`` is
the object of values set at plan time; ``env_forward`` and ``env_unset`` list names. The rank order (``rank_order``, and each
instance's ``group``) is written only when it is not the given order, so that the JSON of a
plan that does not use it is what it was before rank orders existed. A string
holding bytes that are not UTF-8 (a Latin-1 file name in argv) is ``{"$bytes": BASE64}``
(:mod:`poprun.core.rawbytes`), so the text is UTF-8 and apply gets the exact bytes.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)

from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.record import fields
from poprun.core.span import SourceSpan
from poprun.planner import plan as p


def _is_record(cls: Any) -> bool:
    return isinstance(cls, type) and hasattr(cls, "__record_fields__")


def _record_hooks(conv: cattrs.Converter) -> None:
    """
    Teach ``conv`` records (:mod:`poprun.core.record`), as cattrs knows attrs classes.

    Unstructured: a dict of every field. Structured: every field without a default required
    (fields with one were added later, and plans written before lack them), no other key, and
    each failure reported with its path (``$.instances[0].host``) through cattrs' notes.
    """

    def unstructure(cls: type) -> Any:
        names = [f.name for f in fields(cls)]
        return lambda value: {name: conv.unstructure(getattr(value, name)) for name in names}

    def structure(cls: type) -> Any:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in fields(cls)]
        optional = {f.name for f in fields(cls) if not f.required}  # added later: older plans lack them

        def hook(data: Any, _: type) -> Any:
            if not isinstance(data, dict):
                msg = f"expected an object, found {type(data).__name__}"
                raise TypeError(msg)
            extra = set(data) - set(names)
            if extra:
                raise ForbiddenExtraKeysError(None, cls, extra)
            values: dict[str, Any] = {}
            errors: list[Exception] = []
            for name in names:
                if name in optional and name not in data:
                    continue
                try:
                    values[name] = conv.structure(data[name], hints[name])
                except Exception as exc:  # noqa: BLE001 - every field's failure is collected, as cattrs does
                    exc.add_note(AttributeValidationNote(f"Structuring class {cls.__qualname__} @ attribute {name}",
                                                         name, hints[name]))
                    errors.append(exc)
            if errors:
                msg = f"While structuring {cls.__qualname__}"
                raise ClassValidationError(msg, errors, cls)
            return cls(**values)

        return hook

    conv.register_unstructure_hook_factory(_is_record, unstructure)
    conv.register_structure_hook_factory(_is_record, structure)


def _tuple_hooks(conv: cattrs.Converter) -> None:
    """Structure tuples only from JSON arrays (a string is not a list of its characters), each failure with its index."""

    def is_tuple(cls: Any) -> bool:
        return typing.get_origin(cls) is tuple

    def structure(cls: Any) -> Any:
        args = typing.get_args(cls)
        variadic = len(args) == 2 and args[1] is Ellipsis  # noqa: PLR2004 - tuple[X, ...]

        def hook(data: Any, _: type) -> tuple[Any, ...]:
            if not isinstance(data, list | tuple):
                msg = f"expected an array, found {type(data).__name__}"
                raise TypeError(msg)
            if not variadic and len(data) != len(args):
                msg = f"expected an array of {len(args)} items, found {len(data)}"
                raise TypeError(msg)
            values, errors = [], []
            for index, item in enumerate(data):
                kind = args[0] if variadic else args[index]
                try:
                    values.append(conv.structure(item, kind))
                except Exception as exc:  # noqa: BLE001 - every item's failure is collected, as cattrs does
                    exc.add_note(IterableValidationNote(f"Structuring {cls} @ index {index}", index, kind))
                    errors.append(exc)
            if errors:
                raise IterableValidationError(f"While structuring {cls}", errors, cls)
            return tuple(values)

        return hook

    conv.register_structure_hook_factory(is_tuple, structure)


def _converter() -> cattrs.Converter:
    """
    Return the plan's converter: strict scalars, tuples, records, and the hooks of the keys whose JSON form differs.

    Length: each hook is a closure over this converter (cattrs calls them with it), so they are
    defined here, one after another, in the order of the plan's keys.
    """
    from poprun.planner.plancheck import strict_scalars

    conv = cattrs.Converter(forbid_extra_keys=True)
    strict_scalars(conv)
    _tuple_hooks(conv)
    _record_hooks(conv)

    def unstructure_instance(instance: p.Instance) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: conv.unstructure(getattr(instance, f.name))
                                for f in fields(p.Instance) if f.name != "env" and (f.name != "group" or instance.group)}
        data["env"] = dict(instance.env.set)
        data["env_forward"] = list(instance.env.forward)
        data["env_unset"] = list(instance.env.unset)
        return data

    def structure_instance(data: dict[str, Any], _: type) -> p.Instance:
        if not isinstance(data, dict):
            msg = f"expected an object, found {type(data).__name__}"
            raise TypeError(msg)
        missing = [key for key in ("env", "env_forward", "env_unset") if key not in data]
        if missing:
            msg = f"no {missing[0]}"
            raise TypeError(msg)
        if not isinstance(data["env"], dict):
            msg = f"env: expected an object, found {type(data['env']).__name__}"
            raise TypeError(msg)
        data = dict(data)
        env = {"set": sorted(data.pop("env").items()), "forward": data.pop("env_forward"),
               "unset": data.pop("env_unset")}
        instance: p.Instance = structure_record({**data, "env": env}, p.Instance)
        return instance

    def structure_scalar(value: object, _: object) -> str | int | bool:
        if not isinstance(value, str | int | bool):
            msg = f"expected a string, number or boolean, found {value!r}"
            raise TypeError(msg)
        return value

    structure_backend_record = conv.get_structure_hook(p.BackendChoice)

    def structure_backend(data: dict[str, Any], _: type) -> p.BackendChoice:
        """Structure a backend record; one written before traits and settings were recorded gets the table's and the defaults."""
        if isinstance(data, dict) and isinstance(data.get("name"), str) and not {"traits", "settings"} <= set(data):
            from poprun.planner.setting import backend_rows, default_settings
            from poprun.planner.trait import builtin_traits

            data = dict(data)
            if "traits" not in data:
                data["traits"] = conv.unstructure(builtin_traits(data["name"]))
            if "settings" not in data:
                data["settings"] = conv.unstructure(default_settings(backend_rows(data["name"])))
        choice: p.BackendChoice = structure_backend_record(data, p.BackendChoice)
        return choice

    structure_record = conv.get_structure_hook(p.Instance)
    conv.register_structure_hook(p.BackendChoice, structure_backend)
    conv.register_structure_hook(str | int | bool, structure_scalar)
    conv.register_unstructure_hook(p.Instance, unstructure_instance)
    _plan_hook(conv)
    conv.register_structure_hook(p.Instance, structure_instance)
    return conv


def _plan_hook(conv: cattrs.Converter) -> None:
    """Write a plan's rank order only when it is not the given order (the JSON of other plans stays as it was)."""
    unstructure_record = conv.get_unstructure_hook(p.LaunchPlan)

    def unstructure_plan(plan: p.LaunchPlan) -> dict[str, Any]:
        data: dict[str, Any] = unstructure_record(plan)
        if plan.rank_order == p.NO_RANK_ORDER:
            del data["rank_order"]
        return data

    conv.register_unstructure_hook(p.LaunchPlan, unstructure_plan)


_CONVERTER: cattrs.Converter | None = None


def converter() -> cattrs.Converter:
    """Return the shared converter, built on first use."""
    global _CONVERTER  # noqa: PLW0603 - built lazily to keep start-up fast
    if _CONVERTER is None:
        _CONVERTER = _converter()
    return _CONVERTER


def to_dict(plan: p.LaunchPlan) -> dict[str, Any]:
    """Return the plan as JSON-ready data (strings holding bytes that are not UTF-8 as ``{"$bytes": BASE64}``)."""
    from poprun.core.rawbytes import to_json_data

    data: dict[str, Any] = to_json_data(converter().unstructure(plan))  # type: ignore[assignment]
    return p.leave_out_defaults(plan, data)


def to_json(plan: p.LaunchPlan) -> str:
    """Return the plan as deterministic JSON text (sorted keys, two-space indent, final newline)."""
    return json.dumps(to_dict(plan), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def from_json(text: str, *, file: str = "<plan>") -> p.LaunchPlan:
    """
    Return the plan in ``text``.

    Diagnostics:
        PR114 when the text is not a plan of this format version (the detail names both versions),
        or breaks a rule the solver keeps (:mod:`poprun.planner.plancheck`): one diagnostic per
        problem, each naming its JSON path.
    """
    data = _parse(text, file)
    if not isinstance(data, dict):
        raise _invalid(file, "$", "a plan is a JSON object")
    version = data.get("format_version")
    if type(version) is not int or version != p.FORMAT_VERSION:  # not True, not 1.0, not "1"
        raise _invalid(file, "$.format_version", _version_detail(data))
    from poprun.planner.plancheck import validate_plan, validate_plan_data

    found = validate_plan_data(data, file=file)
    if found:
        raise DiagnosticError(found)
    try:
        plan: p.LaunchPlan = converter().structure(data, p.LaunchPlan)
    except (cattrs.BaseValidationError, ForbiddenExtraKeysError, KeyError, TypeError, ValueError) as exc:
        if not isinstance(exc, cattrs.BaseValidationError | ForbiddenExtraKeysError):  # the root's extra keys too
            raise _invalid(file, "$", str(exc)) from exc
        raise DiagnosticError([_invalid_at(file, message) for message in cattrs.transform_error(exc, path="$", format_exception=_reason)]
                              [:20]) from exc
    found = validate_plan(plan, file=file)
    if found:
        raise DiagnosticError(found)
    return plan


class _Duplicated(dict[str, Any]):
    """An object of the plan's text that names a key twice (``json`` keeps the last; a reader sees the first)."""

    duplicated = ""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) == len(pairs):
        return data
    marked, seen = _Duplicated(data), set()
    for key, _ in pairs:
        if key in seen:
            marked.duplicated = key
            break
        seen.add(key)
    return marked


def _duplicated_at(data: Any, path: str = "$") -> tuple[str, str] | None:
    """Return the path of the first object in ``data`` that names a key twice, and that key."""
    if isinstance(data, _Duplicated):
        return path, data.duplicated
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _duplicated_at(value, f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]")
        if found:
            return found
    return None


_MAX_DEPTH = 32  # a plan nests 5 deep


def _depth(data: Any) -> int:
    """Return how deep arrays and objects nest in ``data``, without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= _MAX_DEPTH and isinstance(value, dict | list):
            stack.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return deepest


def _parse(text: str, file: str) -> Any:
    """
    Return the JSON data of ``text``.

    Diagnostics:
        PR114 when it is not JSON, nests deeper than any plan, holds a number no plan holds (an
        integer of thousands of digits, a float beyond the largest), an object names a key twice, a
        ``$bytes`` object is not one or a string holds a lone surrogate.
    """
    try:
        data = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise _invalid(file, "$", f"not JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from exc
    except RecursionError as exc:  # arrays or objects nested deeper than any plan's
        raise _invalid(file, "$", "arrays or objects nested too deeply: not a plan") from exc
    except ValueError as exc:  # an integer beyond sys.get_int_max_str_digits()
        raise _invalid(file, "$", "a number with thousands of digits: not a plan") from exc
    if _depth(data) > _MAX_DEPTH:  # the checks below walk the data recursively
        raise _invalid(file, "$", f"arrays or objects nested more than {_MAX_DEPTH} deep: not a plan")
    duplicated = _duplicated_at(data)
    if duplicated:
        path, key = duplicated
        raise _invalid(file, path, f"{path}: key {_quoted(key)} appears twice (which one counts is not clear)")
    from poprun.core.rawbytes import RawBytesError, from_json_data

    try:
        return from_json_data(data)
    except RawBytesError as exc:
        raise _invalid(file, exc.path, str(exc)) from exc


def _quoted(key: str) -> str:
    return "'" + key.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def _reason(exc: BaseException, kind: type | None) -> str:
    """Return what is wrong with one value: our hooks' own words, else cattrs'."""
    from cattrs.v import format_exception

    if isinstance(exc, TypeError) and str(exc).startswith("expected"):
        return str(exc)
    return format_exception(exc, kind)


def _invalid_at(file: str, message: str) -> Diagnostic:
    """Return PR114 for one of cattrs' messages (``expected int @ $.instances[0].index``), placed at its path."""
    what, _, path = message.rpartition(" @ ")
    return _invalid(file, path or "$", f"{path} {what}" if path else message).diagnostics[0]


def _version_detail(data: dict[str, Any]) -> str:
    """Return what is wrong with the format version: missing, or which one against which."""
    if "format_version" not in data:
        return "no format_version: not a plan written by 'poprun plan --format json'"
    by = data.get("poprun_version")
    written = f", written by poprun {by}" if isinstance(by, str) else ""
    version = data["format_version"]
    shown = f"{version!r}" if type(version) is int else f"{json.dumps(version)} (a {type(version).__name__})"
    return (f"the plan has format version {shown}{written}; "
            f"this poprun reads format version {p.FORMAT_VERSION}")


def _invalid(file: str, path: str, detail: str, *, line: int | None = None, column: int | None = None) -> DiagnosticError:
    span = SourceSpan(file=file, key_path=path, line=line, column=column)
    return DiagnosticError([error("PR114", "invalid plan file", detail=detail, span=span,
                                  hint="make the plan again with 'poprun plan --format json -o FILE'")])
