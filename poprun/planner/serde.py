"""
The LaunchPlan as versioned, deterministic JSON, and back.

Layer: ``poprun.planner``; imports cattrs and the plan model.

Same plan, same bytes: keys are sorted, lists keep their order. An instance's ``env`` is
the object of values set at plan time; ``env_forward`` and ``env_unset`` list names.
"""

from __future__ import annotations

import json
import typing
from typing import Any

import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError

from poprun.core.diagnostic import DiagnosticError, error
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


def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)
    _record_hooks(conv)

    def unstructure_instance(instance: p.Instance) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: conv.unstructure(getattr(instance, f.name))
                                for f in fields(p.Instance) if f.name != "env"}
        data["env"] = dict(instance.env.set)
        data["env_forward"] = list(instance.env.forward)
        data["env_unset"] = list(instance.env.unset)
        return data

    def structure_instance(data: dict[str, Any], _: type) -> p.Instance:
        data = dict(data)
        env = {"set": sorted(dict(data.pop("env")).items()), "forward": data.pop("env_forward"),
               "unset": data.pop("env_unset")}
        instance: p.Instance = structure_record({**data, "env": env}, p.Instance)
        return instance

    def structure_scalar(value: object, _: object) -> str | int | bool:
        if not isinstance(value, str | int | bool):
            msg = f"expected a string, number or boolean, found {value!r}"
            raise TypeError(msg)
        return value

    structure_record = conv.get_structure_hook(p.Instance)
    conv.register_structure_hook(str | int | bool, structure_scalar)
    conv.register_unstructure_hook(p.Instance, unstructure_instance)
    conv.register_structure_hook(p.Instance, structure_instance)
    return conv


_CONVERTER: cattrs.Converter | None = None


def converter() -> cattrs.Converter:
    """Return the shared converter, built on first use."""
    global _CONVERTER  # noqa: PLW0603 - built lazily to keep start-up fast
    if _CONVERTER is None:
        _CONVERTER = _converter()
    return _CONVERTER


def to_dict(plan: p.LaunchPlan) -> dict[str, Any]:
    """Return the plan as JSON-ready data."""
    data: dict[str, Any] = converter().unstructure(plan)
    return data


def to_json(plan: p.LaunchPlan) -> str:
    """Return the plan as deterministic JSON text (sorted keys, two-space indent, final newline)."""
    return json.dumps(to_dict(plan), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def from_json(text: str, *, file: str = "<plan>") -> p.LaunchPlan:
    """
    Return the plan in ``text``.

    Diagnostics:
        PR114 when the text is not a plan of this format version (the detail names both versions).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(file, "$", f"not JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from exc
    if not isinstance(data, dict):
        raise _invalid(file, "$", "a plan is a JSON object")
    if data.get("format_version") != p.FORMAT_VERSION:
        raise _invalid(file, "$.format_version", _version_detail(data))
    try:
        return converter().structure(data, p.LaunchPlan)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as exc:
        detail = "; ".join(cattrs.transform_error(exc)) if isinstance(exc, cattrs.BaseValidationError) else str(exc)
        raise _invalid(file, "$", detail) from exc


def _version_detail(data: dict[str, Any]) -> str:
    """Return what is wrong with the format version: missing, or which one against which."""
    if "format_version" not in data:
        return "no format_version: not a plan written by 'poprun plan --format json'"
    by = data.get("poprun_version")
    written = f", written by poprun {by}" if isinstance(by, str) else ""
    return (f"the plan has format version {data['format_version']!r}{written}; "
            f"this poprun reads format version {p.FORMAT_VERSION}")


def _invalid(file: str, path: str, detail: str, *, line: int | None = None, column: int | None = None) -> DiagnosticError:
    span = SourceSpan(file=file, key_path=path, line=line, column=column)
    return DiagnosticError([error("PR114", "invalid plan file", detail=detail, span=span,
                                  hint="make the plan again with 'poprun plan --format json -o FILE'")])
