"""
Writing the DSL: a :class:`Spec` back to the text of a ``.pop`` spec.

Layer: ``poprun.planner``; imports ``poprun.core``, the option table and the grammar
(:mod:`poprun.planner.dsl.grammar`), never lark (the keywords it must quote are known from
the table and the grammar's terminals). :func:`to_dsl` writes one statement per line in a
fixed order, so that :func:`poprun.planner.dsl.read.parse_dsl` reads the same spec back: the
structured statements here, and each one-field statement from its row of the option table.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from typing import cast

from poprun.planner import value as conv
from poprun.planner.dsl.grammar import PATH, STATEMENTS, WORD, split_server
from poprun.planner.option import OPTIONS, Option
from poprun.planner.spec import EnvVarSpec, Sourced, Spec

__all__ = ["to_dsl"]

# A `set` value written without quotes: shell-safe characters only.
_BARE = re.compile(r"[\w.:/@%+=,-]+")
_NUMBER_KINDS = ("int", "nonneg", "count", "port")
# Table fields written by the structured statements below: `offline [for TARGET]`,
# `distribute ssh key (...)`, and the port, which goes into `at HOST:PORT` when it can.
_APART = ("offline_mode", "offline_target", "distribute_ssh_key", "vipu_server_port")


def to_dsl(spec: Spec) -> str:
    """Return ``spec`` written in the DSL, one statement per line, in a fixed order."""
    lines = [*_hosts_lines(spec), *_topology_lines(spec), *_partition_lines(spec), *_env_lines(spec.env),
             *_mask_lines(spec), *_mpi_lines(spec), *_instance_lines(spec), *_table_lines(spec, ""), *_never_retry_lines(spec),
             *_spare_lines(spec),
             *_offline_lines(spec), *_ssh_lines(spec), *_cd_lines(spec), *_run_lines(spec)]
    return "".join(f"{line}\n" for line in lines)


def _hosts_lines(spec: Spec) -> Iterator[str]:
    if spec.hosts is not None:
        yield f"hosts {_host_text(spec.hosts.value)}"
    if spec.host_file is not None:
        yield f"hosts from file {_path(spec.host_file.value)}"


def _host_text(hosts: tuple[str, ...]) -> str:
    from poprun.core.hostlist import HostlistError, compress, expand

    if not hosts:
        return "''"
    try:
        text = compress(hosts)
        if expand(text) == hosts:
            return text
    except HostlistError:
        pass
    return ", ".join(hosts)


def _spare_lines(spec: Spec) -> Iterator[str]:
    if spec.spare_hosts is not None:
        yield f"spare hosts {_host_text(spec.spare_hosts.value)}"


def _topology_lines(spec: Spec) -> Iterator[str]:
    units = (("replicas", "", "replica"), ("ipus_per_replica", "with", "ipu"), ("instances", "over", "instance"),
             ("ilds", "in", "ild"))
    parts: list[str] = []
    for field, preposition, unit in units:
        count = getattr(spec, field)
        if count is not None:
            words = f"{count.value} {unit}{'' if count.value == 1 else 's'}"
            words += " per replica" if unit == "ipu" else ""
            parts.append(f"{preposition} {words}" if parts and preposition else words)
    if parts:
        yield " ".join(parts)


def _partition_lines(spec: Spec) -> Iterator[str]:
    words = [] if spec.partition is None else [_word(spec.partition.value, keywords=("at",))]
    host = None if spec.vipu_server_host is None else spec.vipu_server_host.value
    port = None if spec.vipu_server_port is None else spec.vipu_server_port.value
    server = _server_text(host, port)
    if server is not None:
        words.append(f"at {server}")
    elif host is not None:
        words.append(f"at {_string(host)}")
    options = list(_partition_options(spec, port=port if server is None else None))
    if options:
        words.append(f"({', '.join(options)})")
    if words:
        yield "partition " + " ".join(words)


def _server_text(host: str | None, port: int | None) -> str | None:
    """Return ``host:port`` as one word when it reads back unchanged, else None."""
    if host is None or not host:
        return None
    text = (f"[{host}]" if ":" in host else host) + ("" if port is None else f":{port}")
    try:
        back, back_port, _ = split_server(text)
    except conv.InvalidValueError:
        return None
    same = back == host and (back_port is None if port is None else back_port == str(port))
    return text if same and WORD.fullmatch(text) else None


def _partition_options(spec: Spec, *, port: int | None) -> Iterator[str]:
    yield from _table_lines(spec, "partition")
    if port is not None:
        yield f"port {port}"


def _table_lines(spec: Spec, context: str) -> Iterator[str]:
    """Yield the one-field statements of the option table that stand in ``context``, in the table's order."""
    for option in OPTIONS:
        written = option.dsl or option.dsl_on or option.dsl_off
        if written and option.dsl_in == context and option.field and option.field not in _APART:
            sourced = getattr(spec, option.field)
            if sourced is not None:
                yield _statement(option, sourced.value)


def _statement(option: Option, value: object) -> str:
    """Return the statement of ``option`` that sets ``value``: a switch, or its words and the value."""
    if option.kind == "bool":
        return option.dsl_on if value else option.dsl_off
    if option.dsl_off and value == "":
        return option.dsl_off
    if option.kind in _NUMBER_KINDS:
        return f"{option.dsl} {value}"
    text, keywords = option.text(value), _following(option.dsl)
    if option.kind == "path" and not option.dsl_in:
        return f"{option.dsl} {_path(text, keywords=keywords)}"
    return f"{option.dsl} {_word(text, keywords=keywords)}"


def _following(words: str) -> tuple[str, ...]:
    """Return the keywords that may follow ``words`` in another statement (``cache`` -> ``off``)."""
    head = tuple(words.split())
    return tuple(s.words[len(head)] for s in STATEMENTS.values() if s.words[:len(head)] == head and s.words != head)


def _env_lines(env: tuple[Sourced[EnvVarSpec], ...]) -> Iterator[str]:
    forwards: list[str] = []
    for item in env:
        if item.value.value is None:
            forwards.append(item.value.name)
            continue
        if forwards:
            yield f"forward {', '.join(forwards)}"
            forwards = []
        value = item.value.value
        yield f"set {item.value.name} = {value if _BARE.fullmatch(value) else _string(value)}"
    if forwards:
        yield f"forward {', '.join(forwards)}"


def _never_retry_lines(spec: Spec) -> Iterator[str]:
    if spec.never_retry is not None:
        yield f"never retry {', '.join(map(str, spec.never_retry.value)) or 'none'}"


def _mask_lines(spec: Spec) -> Iterator[str]:
    if spec.mask is not None:
        yield f"mask {', '.join(spec.mask.value)}"


def _mpi_lines(spec: Spec) -> Iterator[str]:
    for field, scope in (("mpi_global_args", "global"), ("mpi_local_args", "local")):
        args = getattr(spec, field)
        if args is not None:
            yield f"mpi {scope} {_string(shlex.join(args.value))}"


def _instance_lines(spec: Spec) -> Iterator[str]:
    for item in spec.instance_args:
        args = item.value
        head = f"instance {args.index}"
        if args.env and not args.mpi_args and all(e.value is None for e in args.env):
            yield f"{head} forward {', '.join(e.name for e in args.env)}"
        elif len(args.env) == 1 and not args.mpi_args:
            yield f"{head} set {args.env[0].name} = {_string(cast('str', args.env[0].value))}"
        else:
            words = [w for e in args.env for w in ("-x", e.name if e.value is None else f"{e.name}={e.value}")]
            yield f"{head} mpi {_string(shlex.join([*args.mpi_args, *words]))}"  # no word after a -x pair


def _offline_lines(spec: Spec) -> Iterator[str]:
    mode = None if spec.offline_mode is None else spec.offline_mode.value
    target = None if spec.offline_target is None else _word(spec.offline_target.value)
    if mode:
        yield "offline" if target is None else f"offline for {target}"
        return
    if mode is False:
        yield "no offline"
    if target is not None:
        yield f"offline target {target}"


def _ssh_lines(spec: Spec) -> Iterator[str]:
    settings = list(_table_lines(spec, "ssh key"))
    options = f"({', '.join(settings)})" if settings else ""
    distribute = None if spec.distribute_ssh_key is None else spec.distribute_ssh_key.value
    if distribute:
        yield f"distribute ssh key {options}".rstrip()
        return
    if distribute is False:
        yield "no distribute ssh key"
    if options:
        yield f"ssh key {options}"


def _cd_lines(spec: Spec) -> Iterator[str]:
    if spec.working_dir is not None:
        yield f"cd {_path(spec.working_dir.value)}"


def _run_lines(spec: Spec) -> Iterator[str]:
    if spec.program is not None:
        words = spec.program.value
        if words and all(w.isprintable() for w in words):
            yield f"run {shlex.join(words)}"
        else:
            yield f"run {json.dumps(list(words), ensure_ascii=False)}"


# Keywords that may stand where a value may (`partition at ...`, `cache off`) are passed as
# ``keywords``; a test writes every keyword into every value to keep these lists complete.
def _word(text: str, *, keywords: tuple[str, ...] = ()) -> str:
    """Return ``text`` as a bare word when it reads back as one, else quoted."""
    return text if WORD.fullmatch(text) and text not in keywords else _string(text)


def _path(text: str, *, keywords: tuple[str, ...] = ()) -> str:
    """Return ``text`` as a bare path when it reads back as one, else quoted."""
    return text if PATH.fullmatch(text) and text not in keywords else _string(text)


def _string(text: str) -> str:
    """Return a quoted string: literal in single quotes when possible, else JSON-escaped."""
    if "'" not in text and text.isprintable():
        return f"'{text}'"
    return json.dumps(text, ensure_ascii=False)
