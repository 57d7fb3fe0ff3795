"""
Stale plans: whether the inputs of a saved plan still hold when it is applied.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model, the :class:`Context` and
the variable names of :mod:`popdist.env`; never the spec, the solver, backends, render or cli.
It reads the file system (a directory, a program on PATH) and changes nothing; the
environment comes from the context, so tests give their own.

A saved plan runs exactly as planned (design.md section 3), so ``poprun apply PLAN.json``
first checks what the plan relies on and was not stored by value: the variables it forwards
by name, the program, the working directory and a fixed executable cache. Files are checked
only for instances that run on this machine; other hosts are the remote backends' concern.
The format version is checked before, when the file is read (PR114, :mod:`serde`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from popdist.env import ALWAYS_FORWARDED
from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.plan import Instance, LaunchPlan

_REMAKE = "('poprun plan --format json -o FILE ...')"


def validate_plan_inputs(plan: LaunchPlan, ctx: Context, *, file: str = "<plan>") -> tuple[Diagnostic, ...]:
    """
    Return a diagnostic for each input of ``plan`` that no longer holds in ``ctx``; none when it is fresh.

    ``file`` is the plan's file name, for the spans (``plan.json``, ``$.instances[0].cwd``).

    Diagnostics:
        PR403 for a forwarded variable not set, a working directory gone, a program not
        found, the parent directory of a fixed executable cache gone, or an instance on this
        machine bound to CPUs or NUMA nodes it does not have (or may not use).
    """
    here = tuple(i for i in plan.instances if _runs_here(plan, i, ctx))
    return (*_forwarded(plan, ctx, file), *_directories(plan, here, file), *_programs(plan, here, ctx, file),
            *_cache(plan, here, file), *_bindings(plan, ctx, file))


def _runs_here(plan: LaunchPlan, instance: Instance, ctx: Context) -> bool:
    return plan.offline or plan.backend.traits.all_here or instance.host in ctx.local_names


def _stale(summary: str, *, detail: str, file: str, key_path: str, hint: str,
           related: tuple[SourceSpan, ...] = ()) -> Diagnostic:
    return error("PR403", f"stale plan: {summary}", detail=detail, span=SourceSpan(file=file, key_path=key_path),
                 hint=hint, related=related)


def _which(indices: list[int], plan: LaunchPlan) -> str:
    """Return ``every instance``, ``instance 1`` or ``instances 0, 2 and 3``."""
    if len(indices) == len(plan.instances) > 1:
        return "every instance"
    words = [str(i) for i in indices]
    if len(words) == 1:
        return f"instance {words[0]}"
    return f"instances {', '.join(words[:-1])} and {words[-1]}"


def _forwarded(plan: LaunchPlan, ctx: Context, file: str) -> Iterator[Diagnostic]:
    """PR403 for each variable forwarded by name that is not set (PATH and the like are optional)."""
    missing: dict[str, list[tuple[int, int]]] = {}
    for instance in plan.instances:
        for position, name in enumerate(instance.env.forward):
            if name not in ALWAYS_FORWARDED and name not in ctx.environ:
                missing.setdefault(name, []).append((instance.index, position))
    for name, where in missing.items():
        index, position = where[0]
        yield _stale(f"forwarded variable '{name}' is not set",
                     detail=f"the plan forwards {name} from the launching shell to "
                            f"{_which([i for i, _ in where], plan)}, and it is not set now",
                     file=file, key_path=f"$.instances[{index}].env_forward[{position}]",
                     hint=f"set {name} (export {name}=...) and apply again, or make the plan again without it {_REMAKE}",
                     related=(SourceSpan.env(name),))


def _directories(plan: LaunchPlan, here: tuple[Instance, ...], file: str) -> Iterator[Diagnostic]:
    """PR403 for each working directory that is gone."""
    gone: dict[str, list[int]] = {}
    for instance in here:
        if not Path(instance.cwd).is_dir():
            gone.setdefault(instance.cwd, []).append(instance.index)
    for cwd, indices in gone.items():
        what = "is no longer a directory" if Path(cwd).exists() else "no longer exists"
        yield _stale(f"working directory '{cwd}' is gone",
                     detail=f"the plan runs {_which(indices, plan)} in {cwd}, which {what}",
                     file=file, key_path=f"$.instances[{indices[0]}].cwd",
                     hint=f"create {cwd} again, or make the plan again in the directory to run in {_REMAKE}")


def _programs(plan: LaunchPlan, here: tuple[Instance, ...], ctx: Context, file: str) -> Iterator[Diagnostic]:
    """PR403 for each program that is not found where the local backend would look for it."""
    missing: dict[tuple[str, str], list[int]] = {}
    for instance in here:
        if instance.argv and Path(instance.cwd).is_dir() and not _found(instance, ctx):
            missing.setdefault((instance.argv[0], instance.cwd), []).append(instance.index)
    for (name, cwd), indices in missing.items():
        where = (f"'{name}' is not on PATH or in {cwd}" if "/" not in name
                 else f"{Path(cwd, name)} does not exist")
        yield _stale(f"program '{name}' not found",
                     detail=f"the plan runs '{name}' in {_which(indices, plan)}, and {where}",
                     file=file, key_path=f"$.instances[{indices[0]}].argv[0]",
                     hint=f"put the program back (or fix PATH), or make the plan again with its new name or path {_REMAKE}")


def _found(instance: Instance, ctx: Context) -> bool:
    """Return whether ``argv[0]`` exists: on the instance's PATH, or as a path from its cwd (changelog 2.1)."""
    name = instance.argv[0]
    if "/" not in name and shutil.which(name, path=_path_of(instance, ctx)) is not None:
        return True
    return Path(instance.cwd, name).exists()


def _path_of(instance: Instance, ctx: Context) -> str:
    """Return the PATH the instance gets: set by the plan, else the launching shell's unless unset."""
    value = instance.env.get("PATH")
    if value is None and "PATH" not in instance.env.unset:
        value = ctx.environ.get("PATH")
    return os.defpath if value is None else value


def _cache(plan: LaunchPlan, here: tuple[Instance, ...], file: str) -> Iterator[Diagnostic]:
    """PR403 when a fixed executable cache's parent directory is gone."""
    if plan.cache.mode != "user" or not plan.cache.path or not here:
        return
    path = Path(here[0].cwd, plan.cache.path)
    if not path.parent.is_dir():
        yield _stale(f"the executable cache's directory '{path.parent}' is gone",
                     detail=f"the plan keeps its executable cache in {path}, and {path.parent} no longer exists",
                     file=file, key_path="$.cache.path",
                     hint=f"create {path.parent} again, or make the plan again with another --executable-cache-path "
                          f"{_REMAKE}")


def _bindings(plan: LaunchPlan, ctx: Context, file: str) -> Iterator[Diagnostic]:
    """PR403 for each instance on this machine bound to CPUs or NUMA nodes this machine does not let it use."""
    mine = [(k, i) for k, i in enumerate(plan.instances) if i.host in ctx.local_names and
            (i.placement.cpus or i.placement.numa_nodes)]
    if not mine or ctx.probe is None:
        return
    from poprun.planner.machine import parse_cpulist

    try:
        machine = ctx.probe()
    except (OSError, ValueError):  # the topology cannot be read: the backend reports what binding does
        return
    cpus = {cpu for node in machine.numa_nodes for cpu in node.cpus}
    if machine.cpuset is not None:
        cpus &= set(machine.cpuset)
    nodes = {node.index for node in machine.numa_nodes}
    if machine.mems is not None:
        nodes &= set(machine.mems)
    for k, instance in mine:
        for key, text, allowed, noun in (("cpus", instance.placement.cpus, cpus, "CPUs"),
                                         ("numa_nodes", instance.placement.numa_nodes, nodes, "NUMA nodes")):
            missing = sorted(set(parse_cpulist(text)) - allowed) if text and allowed else []
            if missing:
                yield _stale(f"instance {instance.index} is bound to {noun} this machine does not have",
                             detail=f"the plan binds instance {instance.index} to {noun} {text}; this machine "
                                    f"({machine.name}) lets it use {noun} {_ranges(sorted(allowed))}",
                             file=file, key_path=f"$.instances[{k}].placement.{key}",
                             hint=f"make the plan again on this machine {_REMAKE}")
                break


def _ranges(numbers: list[int]) -> str:
    from poprun.planner.machine import cpulist

    return cpulist(numbers)
