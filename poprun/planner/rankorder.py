r"""
Rank order: the order of the hosts, which instance indices follow (docs/placement.md, "Rank order").

Layer: ``poprun.planner``; imports ``poprun.core`` (host lists, diagnostics, bounded file
reading), the plan model and the solver's state. Imported by :mod:`poprun.planner.solve` only
when the spec names a rank order or a network topology, so that a launch in the given order
never loads it; runs ``scontrol show topology`` only for ``--rank-order topology`` inside a
Slurm allocation without a topology file.

Three orders:

- ``given``: the hosts as listed (``-H``, the host file, or the allocation's nodes).
- ``natural``: by :func:`natural_key`: a name is split at its dots into labels (``node7.rack2``:
  ``node7``, ``rack2``), labels compare one by one, a shorter name that is a prefix of a longer
  one first; within a label, runs of digits compare by value (``node7`` < ``node8`` < ``node66``),
  runs of other characters as text, a digit run before a text run; equal values with more
  leading zeros first (``node066`` < ``node66``, as :func:`poprun.core.hostlist.compress` sorts). Distinct names never compare equal, so the
  order is total and does not depend on the input's order (IP addresses sort by their numbers).
- ``topology``: hosts grouped by the leaf switch (Slurm's topology/tree) or block
  (topology/block) they sit under, from a file in Slurm's ``topology.conf`` form or, inside an
  allocation without one, from ``scontrol show topology``. Groups come in the order of a
  depth-first walk of the switch tree: the roots (switches no other switch lists) in the file's
  order, the children of a switch in the order its ``Switches=`` lists them; blocks in the
  file's order. Hosts are natural within a group. So hosts under one leaf are consecutive, and
  leaves under one parent switch are consecutive.

The file (:func:`parse_topology`): one record a line, ``Key=Value`` words, keys in any case;
``#`` starts a comment (``\#`` is a ``#``), a line ending with ``\`` goes on on the next line
(as Slurm's configuration parser reads them). ``SwitchName=NAME`` with ``Nodes=HOSTLIST`` (a
leaf) or ``Switches=HOSTLIST`` (child switches), and an optional ``LinkSpeed=`` (ignored);
``BlockName=NAME Nodes=HOSTLIST`` and one ``BlockSizes=N,...`` (checked, not needed for the
order). A file holds switches or blocks, not both. Every problem is a diagnostic naming its
line: PR258 (a line poprun cannot read), PR259 (a switch tree that is not a tree: a switch that
lists itself, a cycle, a switch under two parents, an unknown child switch, a name given twice,
a host in two blocks). A host under two leaf switches (two rails) is grouped under the first in
the walk. ``scontrol show topology`` prints the same records with more keys (``Level=``, and a
parent's ``Nodes=`` listing every node below it), which are ignored there.
"""

from __future__ import annotations

import re

from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.hostlist import MAX_HOSTS, HostlistError, expand
from poprun.core.hostlist import natural_key as _label_key
from poprun.core.record import record
from poprun.core.span import SourceSpan
from poprun.planner import plan as p

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from poprun.planner.spec import Sourced
    from poprun.planner.state import Solver

MODES = ("given", "natural", "topology")
SCONTROL = "scontrol show topology"
SCONTROL_TIMEOUT_S = 20.0  # the controller's answer; a busy one answers within seconds
MAX_OUTPUT = 4 * 1024 * 1024  # bytes of scontrol's answer read at most
MAX_PROBLEMS = 20  # a file with more problems than this is not worth listing them all
MAX_LEVELS = 64  # levels of switches in a tree (real networks have 2 to 4)
MAX_NAMES = 1_000_000  # hosts and switches a topology names in all (each host list: at most 100,000)
_FILE_KEYS = ("switchname", "switches", "nodes", "linkspeed", "blockname", "blocksizes")
_WORD = re.compile(r'\s*([A-Za-z][A-Za-z0-9_]*)=("[^"]*"|[^\s"]*)(?=\s|$)')
_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:+-]*\Z")


def natural_key(host: str) -> tuple[tuple[tuple[int, int, str, str], ...], ...]:
    """Return the key of ``host`` in the natural order (see the module docstring): label by label, numbers by value."""
    return tuple(_label_key(label) for label in host.split("."))


def natural(hosts: Iterable[str]) -> tuple[str, ...]:
    """Return ``hosts`` in the natural order."""
    return tuple(sorted(hosts, key=natural_key))


@record
class Leaf:
    """A group of the topology: a leaf switch (with the switches above it, the nearest first) or a block."""

    name: str
    hosts: tuple[str, ...]  # as the file names them, in the file's order
    parents: tuple[str, ...] = ()


@record
class NetworkTopology:
    """A topology file read: ``kind`` ``tree`` or ``block``, its groups in walk order."""

    kind: str
    leaves: tuple[Leaf, ...]
    block_sizes: tuple[int, ...] = ()


@record
class _Line:
    """One record of the file: its line number, text, and its words (lower-case key -> value, column)."""

    number: int
    text: str
    words: dict[str, tuple[str, int]]


class _Reader:
    """Collects the diagnostics of one topology text, each placed at its line."""

    def __init__(self, file: str, *, scontrol: bool) -> None:
        self.file = file
        self.scontrol = scontrol
        self.found: list[Diagnostic] = []

    def fail(self, code: str, line: _Line | None, detail: str, hint: str, *, column: int = 1, length: int = 1) -> None:
        if len(self.found) >= MAX_PROBLEMS:
            return
        summary = "invalid network topology" if code == "PR258" else "network topology is not a tree"
        if line is None:
            span = SourceSpan(file=self.file, key_path="--network-topology")
        else:
            span = SourceSpan(file=self.file, key_path=f"line {line.number}", line=line.number, column=column,
                              end_line=line.number, end_column=column + length)
        self.found.append(error(code, summary, detail=detail, span=span, hint=hint,
                                source_line=line.text if line is not None else None))


def parse_topology(text: str, *, file: str, scontrol: bool = False) -> NetworkTopology:
    """
    Return the topology of ``text`` (Slurm's ``topology.conf`` form; ``scontrol``: the output of ``scontrol show topology``).

    Diagnostics:
        PR258 for a line that cannot be read, PR259 for a switch tree that is not a tree (each
        with its line); raises :class:`DiagnosticError` with all of them (at most 20).
    """
    reader = _Reader(file, scontrol=scontrol)
    lines = [line for line in (_words(reader, n, t) for n, t in _logical_lines(text, reader)) if line is not None]
    kinds = {("block" if "blockname" in line.words or "blocksizes" in line.words else "tree") for line in lines}
    if not lines and not reader.found:
        reader.fail("PR258", None, f"{file} names no switch and no block",
                    "write one SwitchName=... line per switch (or BlockName=... per block), as in Slurm's topology.conf")
    if len(kinds) > 1:
        first = next(line for line in lines if "blockname" in line.words or "blocksizes" in line.words)
        reader.fail("PR258", first, "the file names both switches (SwitchName=) and blocks (BlockName=)",
                    "a topology is a switch tree or blocks: keep one of them")
    topology = None
    if not reader.found:
        topology = _blocks(reader, lines) if kinds == {"block"} else _tree(reader, lines)
    if reader.found or topology is None:
        raise DiagnosticError(reader.found)
    return topology


def _logical_lines(text: str, reader: _Reader) -> Iterable[tuple[int, str]]:
    """Yield (first line number, text) of each record: comments removed, continued lines joined."""
    held, start = "", 0
    for number, raw in enumerate(text.split("\n"), start=1):
        if "\0" in raw:
            reader.fail("PR258", _Line(number=number, text=raw.replace("\0", "\\0"), words={}),
                        "the line holds a NUL character", "remove it: a topology file is text",
                        column=raw.index("\0") + 1)
            continue
        line = _uncomment(raw)
        if not held:
            start = number
        if line.endswith("\\"):  # joined as Slurm joins it: the backslash removed, nothing added
            held += line[:-1]
            continue
        whole, held = held + line, ""
        if whole.strip():
            yield start, whole
    if held.strip():
        yield start, held


def _uncomment(line: str) -> str:
    r"""Return ``line`` without its comment (``#`` to the end; ``\#`` is a ``#``)."""
    out, i = [], 0
    while i < len(line):
        if line.startswith("\\#", i):
            out.append("#")
            i += 2
            continue
        if line[i] == "#":
            break
        out.append(line[i])
        i += 1
    return "".join(out)


def _words(reader: _Reader, number: int, text: str) -> _Line | None:
    """Return the record of one line, or None (with a diagnostic) when a word is not ``Key=Value`` or a key is unknown."""
    line = _Line(number=number, text=text, words={})
    position = 0
    while position < len(text) and text[position:].strip():
        found = _WORD.match(text, position)
        if found is None:
            column = len(text) - len(text[position:].lstrip()) + 1
            word = text[column - 1:].split(maxsplit=1)[0]
            reader.fail("PR258", line, f"'{word[:40]}' is not a Key=Value word", "write Key=Value words separated by "
                        "spaces, e.g. SwitchName=s1 Nodes=node[1-4]", column=column, length=len(word))
            return None
        key, value = found.group(1).lower(), found.group(2)
        if key not in _FILE_KEYS and not reader.scontrol:
            reader.fail("PR258", line, f"unknown key '{found.group(1)}'", "the keys of a topology file are SwitchName, "
                        "Switches, Nodes, LinkSpeed, BlockName and BlockSizes", column=found.start(1) + 1,
                        length=len(found.group(1)))
            return None
        if key in line.words and not reader.scontrol:
            reader.fail("PR258", line, f"key '{found.group(1)}' given twice on one line", "give each key once",
                        column=found.start(1) + 1, length=len(found.group(1)))
            return None
        line.words.setdefault(key, (value[1:-1] if value.startswith('"') else value, found.start(2) + 1))
        position = found.end()
    first = next(iter(line.words), "")
    if reader.scontrol and first not in ("switchname", "blockname"):  # a record of a later Slurm's: not a group
        return line if "switchname" in line.words or "blockname" in line.words else None
    if first not in ("switchname", "blockname", "blocksizes"):
        reader.fail("PR258", line, "a record starts with SwitchName=, BlockName= or BlockSizes=",
                    "begin the line with the name of its switch or block, e.g. SwitchName=s1 Nodes=node[1-4]")
        return None
    return line


def _names(reader: _Reader, line: _Line, key: str, budget: list[int]) -> tuple[str, ...]:
    """Return the names of a host list value (``Nodes=``, ``Switches=``); a diagnostic and ``()`` when it is not one."""
    value, column = line.words[key]
    if not value:
        reader.fail("PR258", line, f"{key.capitalize()}= names nothing", "name at least one, e.g. Nodes=node[1-4]",
                    column=column)
        return ()
    try:
        names = expand(value)
    except HostlistError as exc:
        reader.fail("PR258", line, f"{key.capitalize()}={value[:60]}: {exc.message}", exc.hint,
                    column=column + exc.position, length=max(exc.length, 1))
        return ()
    budget[0] -= len(names)
    if budget[0] < 0:
        reader.fail("PR258", line, f"the file names more than {MAX_NAMES} hosts and switches",
                    "split the topology, or keep the part of the hosts you launch on", column=column)
        return ()
    return names


def _name(reader: _Reader, line: _Line, key: str) -> str | None:
    """Return the name of a switch or block (``SwitchName=``, ``BlockName=``), or None with a diagnostic."""
    value, column = line.words[key]
    if not _NAME.match(value):
        reader.fail("PR258", line, f"{'switch' if key == 'switchname' else 'block'} name '{value[:40]}' is not a name",
                    "name it with letters, digits, '.', '_', ':', '+' and '-'", column=column, length=max(len(value), 1))
        return None
    return value


@record
class _Switch:
    name: str
    line: _Line
    nodes: tuple[str, ...]
    children: tuple[str, ...]


def _tree(reader: _Reader, lines: list[_Line]) -> NetworkTopology | None:
    """Return the leaves of a switch tree in walk order (PR258/PR259 for what is not one)."""
    budget = [MAX_NAMES]
    switches: dict[str, _Switch] = {}
    for line in lines:
        name = _name(reader, line, "switchname")
        if name is None:
            continue
        has_nodes, has_children = "nodes" in line.words, "switches" in line.words
        if has_nodes and has_children and not reader.scontrol:
            reader.fail("PR258", line, f"switch {name} has both Nodes= and Switches=",
                        "a switch has nodes (a leaf) or child switches, not both (as in Slurm)",
                        column=line.words["switches"][1])
            continue
        if not has_nodes and not has_children:
            reader.fail("PR258", line, f"switch {name} has neither Nodes= nor Switches=",
                        "give its nodes (Nodes=node[1-4]) or its child switches (Switches=s[1-2])")
            continue
        children = _names(reader, line, "switches", budget) if has_children else ()
        nodes = () if has_children else _names(reader, line, "nodes", budget)
        if name in switches:
            reader.fail("PR259", line, f"switch {name} is named twice (first on line {switches[name].line.number})",
                        "name each switch once")
            continue
        switches[name] = _Switch(name=name, line=line, nodes=nodes, children=children)
    if reader.found:
        return None
    parents = _parents(reader, switches)
    if reader.found:
        return None
    return NetworkTopology(kind="tree", leaves=tuple(_walk(switches, parents)))


def _parents(reader: _Reader, switches: dict[str, _Switch]) -> dict[str, str]:
    """Return each switch's parent; PR259 for a switch that lists itself, an unknown child, two parents, a cycle."""
    parent: dict[str, str] = {}
    for switch in switches.values():
        listed, column = switch.line.words.get("switches", ("", 1))
        length = max(len(listed), 1)
        for child in switch.children:
            if child == switch.name:
                reader.fail("PR259", switch.line, f"switch {child} lists itself among its Switches=",
                            "list only the switches below it", column=column, length=length)
            elif child not in switches:
                reader.fail("PR259", switch.line, f"switch {switch.name} lists switch {child}, which no SwitchName= "
                            "line names", f"add a line SwitchName={child} Nodes=... (or remove it)", column=column, length=length)
            elif child in parent:
                reader.fail("PR259", switch.line, f"switch {child} is under two switches: {parent[child]} and "
                            f"{switch.name}", "a switch tree gives each switch one parent: list it under one",
                            column=column, length=length)
            else:
                parent[child] = switch.name
    _check_cycles(reader, switches, parent)
    return parent


def _check_cycles(reader: _Reader, switches: dict[str, _Switch], parent: dict[str, str]) -> None:
    """PR259 for the first cycle of parents (each switch is visited once: a chain of a million switches is linear)."""
    state: dict[str, bool] = {}  # True: on the path walked now; False: known to reach a root
    depth: dict[str, int] = {}  # switches above each one
    for name in switches:
        path: list[str] = []
        current: str | None = name
        while current is not None and current not in state:
            state[current] = True
            path.append(current)
            current = parent.get(current)
        if current is not None and state[current]:
            cycle = path[path.index(current):]
            reader.fail("PR259", switches[current].line, f"switch {current} is below itself (a cycle through "
                        f"{' -> '.join([*cycle, current])})", "a switch tree has no cycle: remove one link")
            return
        above = depth[current] + 1 if current is not None else 0
        for walked in reversed(path):
            state[walked], depth[walked] = False, above
            if above > MAX_LEVELS:
                reader.fail("PR259", switches[walked].line, f"switch {walked} is more than {MAX_LEVELS} levels below "
                            "the top of its tree", "a network has a few levels of switches: check the Switches= lists")
                return
            above += 1


def _walk(switches: dict[str, _Switch], parent: dict[str, str]) -> Iterable[Leaf]:
    """Yield the leaf switches depth-first: roots in the file's order, children in their ``Switches=`` order."""
    stack: list[tuple[str, tuple[str, ...]]] = [(name, ()) for name in reversed([n for n in switches if n not in parent])]
    while stack:
        name, above = stack.pop()
        switch = switches[name]
        if switch.children:
            stack.extend((child, (name, *above)) for child in reversed(switch.children))
        else:
            yield Leaf(name=name, hosts=switch.nodes, parents=above)


def _blocks(reader: _Reader, lines: list[_Line]) -> NetworkTopology | None:
    """Return the blocks in the file's order, and the block sizes (PR258/PR259 for what is not one)."""
    budget = [MAX_NAMES]
    blocks: dict[str, Leaf] = {}
    owner: dict[str, str] = {}
    sizes: tuple[int, ...] = ()
    for line in lines:
        if "blocksizes" in line.words:
            sizes = _block_sizes(reader, line, given=bool(sizes))
            continue
        name = _name(reader, line, "blockname")
        if name is None:
            continue
        if "nodes" not in line.words or "switches" in line.words:
            reader.fail("PR258", line, f"block {name} needs Nodes= (and no Switches=)", "give its nodes, e.g. "
                        "BlockName=b1 Nodes=node[1-4]")
            continue
        nodes = _names(reader, line, "nodes", budget)
        if name in blocks:
            reader.fail("PR259", line, f"block {name} is named twice", "name each block once")
            continue
        for node in nodes:
            if node in owner:
                reader.fail("PR259", line, f"node {node} is in two blocks: {owner[node]} and {name}",
                            "put each node in one block", column=line.words["nodes"][1])
                break
            owner[node] = name
        blocks[name] = Leaf(name=name, hosts=nodes)
    if reader.found:
        return None
    return NetworkTopology(kind="block", leaves=tuple(blocks.values()), block_sizes=sizes)


def _block_sizes(reader: _Reader, line: _Line, *, given: bool) -> tuple[int, ...]:
    value, column = line.words["blocksizes"]
    if given:
        reader.fail("PR258", line, "BlockSizes= is given twice", "give the block sizes once", column=column)
        return ()
    if len(line.words) > 1 and not reader.scontrol:
        reader.fail("PR258", line, "BlockSizes= stands on a line of its own", "move the other keys to their own line",
                    column=column)
        return ()
    sizes = tuple(int(v) for v in value.split(",") if v.isdigit() and 0 < int(v) <= MAX_HOSTS)
    if not value or len(sizes) != len(value.split(",")):
        reader.fail("PR258", line, f"BlockSizes={value[:40]} is not a list of positive numbers",
                    "write the sizes as numbers, e.g. BlockSizes=4,16", column=column)
        return ()
    return sizes


def order(hosts: tuple[str, ...], topology: NetworkTopology) -> tuple[tuple[p.RankGroup, ...], tuple[str, ...]]:
    """
    Return the groups of ``hosts`` under ``topology`` (each group's hosts natural, groups in walk order), and the hosts it does not name.

    Only groups that hold one of ``hosts`` are returned. A host under two leaves joins the first.
    """
    wanted = set(hosts)
    placed: set[str] = set()
    groups: list[p.RankGroup] = []
    for leaf in topology.leaves:
        mine = [h for h in dict.fromkeys(leaf.hosts) if h in wanted and h not in placed]
        if mine:
            placed.update(mine)
            groups.append(p.RankGroup(name=leaf.name, hosts=natural(mine), parents=leaf.parents))
    return tuple(groups), tuple(h for h in hosts if h not in placed)


def read_topology(s: Solver, given: Sourced[str]) -> NetworkTopology | None:
    """Return the topology of the file ``given`` names (relative to the directory poprun runs in); None with diagnostics."""
    from poprun.core.purepath import pure
    from poprun.core.textfile import read_text_file

    path = str(pure(s.ctx.cwd, given.value))
    try:
        text = read_text_file(path, key="--network-topology", span=given.origin, name=given.value)
        return parse_topology(text, file=path)
    except DiagnosticError as exc:  # missing, not a regular file, too large, not text; or what parsing found
        s.diags.extend(exc.diagnostics)
        return None


def scontrol_topology(environ: Mapping[str, str], *, timeout_s: float = SCONTROL_TIMEOUT_S) -> NetworkTopology:
    """
    Return Slurm's topology (``scontrol show topology``, run with ``environ``).

    Diagnostics:
        PR324 when scontrol is missing, fails, does not answer in ``timeout_s`` seconds, answers
        more than 4 MiB, or names no switch and no block (no topology plugin); PR258/PR259 when
        its answer is not a topology.
    """
    import os
    import shutil
    import signal
    import subprocess

    where = SourceSpan.environment(SCONTROL)
    scontrol = shutil.which("scontrol", path=environ.get("PATH", os.defpath))
    if scontrol is None:
        raise _slurm_failed(where, "scontrol is not on PATH", "install Slurm's client commands, or give the file with "
                            "--network-topology FILE")
    try:
        with subprocess.Popen([scontrol, "show", "topology"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # noqa: S603
                              stderr=subprocess.PIPE, env=dict(environ), start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: a child holding the pipes goes too
                proc.communicate()
                raise _slurm_failed(where, f"scontrol did not answer within {timeout_s:g} s",
                                    "check the Slurm controller (scontrol ping), or give the file with "
                                    "--network-topology FILE") from None
    except OSError as exc:
        raise _slurm_failed(where, f"scontrol could not run: {exc.strerror}", "give the file with "
                            "--network-topology FILE") from exc
    said = err.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        raise _slurm_failed(where, f"scontrol failed (exit {proc.returncode}): {said[-1][:200] if said else 'no message'}",
                            "check that the cluster has a topology plugin (TopologyPlugin=topology/tree or "
                            "topology/block), or give the file with --network-topology FILE")
    if len(out) > MAX_OUTPUT:
        raise _slurm_failed(where, f"scontrol answered {len(out)} bytes (at most {MAX_OUTPUT})",
                            "give the file with --network-topology FILE")
    text = out.decode(errors="replace")
    if not any(line.lower().startswith(("switchname=", "blockname=")) for line in text.splitlines()):
        shown = (said or text.strip().splitlines() or ["nothing"])[-1][:200]
        raise _slurm_failed(where, f"Slurm names no switch and no block ({shown})",
                            "the cluster has no topology plugin (TopologyPlugin=topology/tree or topology/block in "
                            "slurm.conf): give the file with --network-topology FILE")
    return parse_topology(text, file=SCONTROL, scontrol=True)


def _slurm_failed(where: SourceSpan, detail: str, hint: str) -> DiagnosticError:
    return DiagnosticError([error("PR324", "cannot read Slurm's network topology", detail=detail, span=where,
                                  hint=hint)])


_REASONS = {
    "given": "the hosts in the order given",
    "natural": "the hosts in natural order: numbers by value (node7 before node66), label by label",
    "topology": "the hosts grouped by leaf switch or block, groups in the switch tree's order, natural within each",
}


def rank_order(s: Solver, hosts: tuple[str, ...]) -> tuple[tuple[str, ...], p.RankOrder]:
    """
    Return ``hosts`` in the order the spec asks for, and the plan's record of it (decisions recorded in ``s``).

    Diagnostics: PR256 (a topology file a non-topology order does not read; a warning), PR257
    (topology without a file outside an allocation), PR258/PR259 and the file codes (the file),
    PR322 (hosts the topology does not name), PR324 (Slurm's topology).
    """
    spec = s.spec
    file = spec.network_topology
    if spec.rank_order is not None:
        mode = s.decide("rank_order.mode", spec.rank_order.value, spec.rank_order.origin, _REASONS[spec.rank_order.value])
    elif file is not None:
        mode = s.decide("rank_order.mode", "topology", file.origin, "not given: a network topology is given; "
                        + _REASONS["topology"])
    else:
        return hosts, p.NO_RANK_ORDER
    if mode != "topology" and file is not None:
        s.warn("PR256", "network topology not used", detail=f"--rank-order {mode} does not read {file.value}",
               span=file.origin, hint="use --rank-order topology to group the hosts by it, or drop --network-topology")
    if mode == "given":
        return hosts, p.NO_RANK_ORDER
    if mode == "natural":
        ordered = natural(hosts)
        s.decide("rank_order.hosts", ordered, SourceSpan.derived("rank_order.hosts"),
                 "unchanged: already in natural order" if ordered == hosts else "sorted from the order given")
        return ordered, p.RankOrder(mode="natural")
    return _topology_order(s, hosts)


def _topology_order(s: Solver, hosts: tuple[str, ...]) -> tuple[tuple[str, ...], p.RankOrder]:
    """Return ``hosts`` grouped by the topology of the file, or of Slurm inside an allocation (see :func:`rank_order`)."""
    file = s.spec.network_topology
    origin = s.spec.rank_order.origin if s.spec.rank_order is not None else SourceSpan.default("rank_order")
    if file is not None:
        source = file.value if file.value.isprintable() else ascii(file.value)  # explain and the plan show one line
        topology, where = read_topology(s, file), file.origin
        reason = "the file given"
    elif _in_allocation(s.ctx.environ):
        source, where = SCONTROL, SourceSpan.environment(SCONTROL)
        reason = "no file given: Slurm's own topology, inside the allocation"
        try:
            topology = scontrol_topology(s.ctx.environ)
        except DiagnosticError as exc:
            s.diags.extend(exc.diagnostics)
            topology = None
    else:
        s.fail("PR257", "rank order topology without a network topology",
               detail="--rank-order topology needs the network's switches, and no topology file is given outside a "
                      "Slurm allocation", span=origin,
               hint="give Slurm's topology.conf with --network-topology FILE, or run inside a Slurm allocation")
        return hosts, p.NO_RANK_ORDER
    if topology is None:
        return hosts, p.NO_RANK_ORDER
    s.decide("rank_order.source", source, where, f"{reason} ({topology.kind}: "
             f"{len(topology.leaves)} {'leaf switches' if topology.kind == 'tree' else 'blocks'})")
    groups, missing = order(hosts, topology)
    spares = s.spec.spare_hosts.value if s.spec.spare_hosts is not None else ()
    missing_spares = order(spares, topology)[1] if spares else ()
    for what, absent in (("host", missing), ("spare host", missing_spares)):
        if absent:
            shown = ", ".join(absent[:5]) + (", ..." if len(absent) > 5 else "")  # noqa: PLR2004 - five are enough
            s.fail("PR322", f"{what} not in the network topology",
                   detail=f"{shown} {'is' if len(absent) == 1 else 'are'} under no "
                          f"{'leaf switch' if topology.kind == 'tree' else 'block'} of {source}",
                   span=where, hint=f"add {'it' if len(absent) == 1 else 'them'} to a "
                   f"{'SwitchName=... Nodes=' if topology.kind == 'tree' else 'BlockName=... Nodes='} line of the "
                   "topology, or use --rank-order natural")
    if missing or missing_spares:
        return hosts, p.NO_RANK_ORDER
    ordered = tuple(h for g in groups for h in g.hosts)
    s.decide("rank_order.hosts", ordered, SourceSpan.derived("rank_order.hosts"),
             f"{len(groups)} group{'s' if len(groups) != 1 else ''}, each consecutive")
    return ordered, p.RankOrder(mode="topology", source=source, kind=topology.kind, groups=groups)


def _in_allocation(environ: Mapping[str, str]) -> bool:
    """Whether poprun runs inside a Slurm allocation (its job id and node list set)."""
    return bool(environ.get("SLURM_JOB_ID")) and bool(environ.get("SLURM_JOB_NODELIST"))


def with_groups(instances: tuple[p.Instance, ...], rank: p.RankOrder) -> tuple[p.Instance, ...]:
    """Return ``instances`` with each one's group (the leaf switch or block of its host) under a topology order."""
    if rank.mode != "topology":
        return instances
    from poprun.core.record import evolve

    group = {host: g.name for g in rank.groups for host in g.hosts}
    return tuple(evolve(i, group=group.get(i.host)) for i in instances)
