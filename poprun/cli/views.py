"""
The views of a plan that ``poprun plan --format NAME`` writes, in one table.

Layer: ``poprun.cli``; each view imports its renderer lazily and returns text. A row says
whether the view shows a saved plan (``poprun plan PLAN.json``) and how it shows what changed
(``poprun plan --diff``). The order of the table is the order formats are listed in messages.
"""

from __future__ import annotations

from collections.abc import Callable

from poprun.core.rawbytes import check_exact
from poprun.core.record import record
from poprun.core.span import SourceSpan
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends.registry import BackendRegistry
    from poprun.planner.spec import Spec
    from poprun.render.diff import Diff


@record
class Shown:
    """
    What a view shows: the plan, and what some views need besides.

    ``spec`` is None for a saved plan; ``launch`` is the poprun command line that runs the plan
    again (for a batch script) and ``hosts`` the hosts the spec names. ``registry()`` is the
    command's backend registry, for the views a backend adds to (None: the view makes one of its
    own and closes it).
    """

    plan: LaunchPlan
    spec: Spec | None = None
    explain: bool = False
    expand: bool = False
    launch: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    registry: Callable[[], BackendRegistry] | None = None


@record
class View:
    """
    One ``--format``: how it shows a plan, whether it shows a saved one, how it shows a diff (or None).

    ``outside_allocation``: the plan is made as outside any Slurm allocation poprun runs in (a
    batch script plans for the allocation it asks for).
    """

    name: str
    show: Callable[[Shown], str]
    saved: bool = True
    diff: Callable[[Diff, str, str], str] | None = None
    outside_allocation: bool = False


_EXACT_HINT = ("rename the file or directory to a UTF-8 name; 'poprun plan --format json' and 'poprun apply' "
               "keep such bytes exactly")


def text(shown: Shown) -> str:
    """Return the plan as text (``poprun plan``), with derivations when ``explain``, after the topology table when asked."""
    from poprun.backends.registry import OnDemand, describe
    from poprun.core.rawbytes import visible
    from poprun.render.explain import render_plan

    with OnDemand() as own:
        backend_text = describe((shown.registry or own)(), shown.plan)
    out = render_plan(shown.plan, explain=shown.explain, backend_text=backend_text)
    if shown.plan.output.print_topology:
        out = topology(shown.plan) + "\n" + out
    return visible(out)  # a byte that is not UTF-8 (a Latin-1 file name) as \xHH


def topology(plan: LaunchPlan) -> str:
    """Return the topology table real poprun printed (``--print-topology``)."""
    from poprun.render.topology import TopologyRow, render_topology

    rows = [TopologyRow(index=i.index, host=i.host, ild=i.ild, replica_offset=i.replica_offset,
                        num_replicas=i.num_local_replicas, devices=",".join(i.devices)) for i in plan.instances]
    return render_topology(rows)


def _json(shown: Shown) -> str:
    from poprun.planner.serde import to_json

    return to_json(shown.plan)


def _toml(shown: Shown) -> str:
    from poprun.planner.tomlspec import to_toml

    assert shown.spec is not None  # not a view of saved plans
    return check_exact(to_toml(shown.spec), what="a TOML spec", span=SourceSpan.flag("--format"), hint=_EXACT_HINT)


def _dot(shown: Shown) -> str:
    from poprun.core.rawbytes import visible
    from poprun.core.secret import mask_text
    from poprun.render.graph import render_dot

    return visible(mask_text(render_dot(shown.plan, expand=shown.expand)))


def _sbatch(shown: Shown) -> str:
    return backend_format("sbatch", shown.plan, command=shown.launch, hosts=shown.hosts, registry=shown.registry)


def backend_format(name: str, plan: LaunchPlan, *, command: tuple[str, ...], hosts: tuple[str, ...],
                   registry: Callable[[], BackendRegistry] | None = None) -> str:
    """
    Return the view ``name`` of ``plan`` that a backend offers (``sbatch``: the slurm backend's batch script).

    ``registry()``: the command's backend registry (None: one of its own, closed before this returns).
    """
    from poprun.backends.base import FormatRequest
    from poprun.backends.registry import OnDemand, find_format

    with OnDemand() as own:
        view = find_format((registry or own)(), name)
        assert view is not None, f"no backend offers --format {name}"  # a built-in's: always there
        shown = view(plan, FormatRequest(command=command, hosts=hosts))
    return check_exact(shown, what=f"the {name} view", span=SourceSpan.flag("--format"), hint=_EXACT_HINT)


def _diff_text(diff: Diff, old_name: str, new_name: str) -> str:
    from poprun.core.rawbytes import visible
    from poprun.render.diff import render_diff

    return visible(render_diff(diff, old_name=old_name, new_name=new_name))


def _diff_json(diff: Diff, old_name: str, new_name: str) -> str:
    from poprun.render.diff import render_diff_json

    return render_diff_json(diff, old_name=old_name, new_name=new_name)


VIEWS: dict[str, View] = {v.name: v for v in (
    View(name="text", show=text, diff=_diff_text),
    View(name="json", show=_json, diff=_diff_json),
    View(name="toml", show=_toml, saved=False),
    View(name="dot", show=_dot),
    View(name="sbatch", show=_sbatch, saved=False, outside_allocation=True),
)}
PLAN_FORMATS = tuple(VIEWS)
SAVED_PLAN_FORMATS = tuple(name for name, view in VIEWS.items() if view.saved)
DIFF_FORMATS = tuple(name for name, view in VIEWS.items() if view.diff is not None)
