"""
The interfaces collectives use, read on each host before the first start: the plan's rule, the hosts' values.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.hostrun`, :mod:`poprun.process.hostscript`
(a stop cancels the readings), the planner's :mod:`~poprun.planner.network` and
:mod:`~poprun.planner.netroute` (pure: the script, its parsing and the choice) and
``poprun.core``; never the solver. Imported only for a plan whose network is left "at launch".

:func:`settle_network` reads every host of the plan in parallel (at most the ssh fan-out's
window at once), through the backend's ``run_on_host``: the ssh backend's own connections
(kept for the launch that follows), ``srun`` inside the Slurm allocation, mpirun's ssh hosts,
``/bin/sh`` here for this machine. Each reading is bounded (:data:`READ_S`); a host that does
not answer is PR476. It returns the plan with each instance's ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` set and ``plan.network`` holding the values (the run record's
``plan.json`` keeps them), or raises the diagnostics (PR318, PR474, PR475, PR478) before
anything starts; a host that answered but could not be read is a warning (PR476): its
instances get no variable. A host the backend cannot reach is left to the launch, whose own
start-up tells it (PR406 ...): a membership policy may then leave it out. Apply never re-solves: the
rule is the plan's.
"""

from __future__ import annotations

import secrets
import threading

from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.threads import spawn
from poprun.planner.netroute import RouteAnswer, host_script, parse

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from poprun.planner.plan import LaunchPlan

__all__ = ["READ_S", "read_routes", "settle_network"]

READ_S = 15.0  # how long one host's reading may take, connecting included


def read_routes(backend: object, hosts: tuple[str, ...], master: str, *, environ: Mapping[str, str],
                stop: threading.Event | None = None, timeout_s: float = READ_S,
                ) -> tuple[dict[str, RouteAnswer | str], dict[str, tuple[Diagnostic, ...]]]:
    """
    Return each host's answer (:func:`~poprun.planner.netroute.parse`) or a one-line reason it has none; and the unreached.

    A host the backend could not reach is left out of the answers: its diagnostics (the
    backend's own, those its preflight gives: PR406, PR407 ...) are the second mapping's.
    """
    from poprun.apply.health import window
    from poprun.apply.hostrun import run_script
    from poprun.backends.base import LaunchError
    from poprun.process.hostscript import CancelledError, Scope, scope

    answers: dict[str, RouteAnswer | str] = {}
    unreached: dict[str, tuple[Diagnostic, ...]] = {}
    lock, cancel = threading.Lock(), Scope()
    slots = threading.BoundedSemaphore(max(1, min(window(environ), len(hosts))))
    run_on_host = getattr(backend, "run_on_host", None)

    def one(host: str) -> None:
        mark = "poprun-net-" + secrets.token_hex(6)
        script = host_script(master, mark)
        try:
            with scope(cancel):
                if callable(run_on_host):
                    status, out = run_on_host(host, script, environ=environ, timeout_s=timeout_s)
                    got: tuple[int, bytes] | str = (int(status), bytes(out))
                else:
                    got = run_script(backend, host, script, environ=environ, timeout_s=timeout_s)
            answer: RouteAnswer | str = got if isinstance(got, str) else parse(got[1], mark)
        except LaunchError as exc:
            answer = exc.message
            if exc.diagnostics:
                with lock:
                    unreached[host] = tuple(exc.diagnostics)
        except CancelledError:
            answer = "stopped"
        except Exception as exc:  # noqa: BLE001 - a plugin's run_on_host that fails otherwise: this host's reason
            answer = " ".join(str(exc or type(exc).__name__).split())
        finally:
            slots.release()
        with lock:
            answers[host] = answer

    threads = []
    for host in hosts:
        slots.acquire()
        threads.append(spawn(one, args=(host,), name=f"poprun-route-{host}"))
    for thread in threads:
        while thread.is_alive():
            thread.join(0.1)
            if stop is not None and stop.is_set():
                cancel.cancel()
    return {h: answers.get(h, "no answer") for h in hosts if h not in unreached}, unreached


def settle_network(backend: object, plan: LaunchPlan, *, environ: Mapping[str, str],
                   stop: threading.Event | None = None) -> tuple[LaunchPlan, tuple[Diagnostic, ...]]:
    """
    Return ``plan`` with the interfaces it left "at launch" read on its hosts, and the warnings (PR476, PR477).

    A host the backend could not reach is not this step's to judge: the launch goes on, that
    host left "at launch" (its instances without the variables), and the launch's own start-up
    names it in the backend's words (the ssh preflight's PR406, through its relay when relays are
    on; mpirun's PR422 ...), after which a membership policy may leave it out.

    Raises:
        DiagnosticError: a host has no route to MASTER_ADDR, no interface in the subnet, or names
            its interface so that Gloo and NCCL cannot take it (PR318, PR474, PR475, PR478).
    """
    from poprun.planner.network import settle

    network = plan.network
    master = network.master_addr or environ.get("MASTER_ADDR", "")
    if not master:
        return plan, ()
    hosts = tuple(h.host for h in network.hosts if not h.interface and not h.how)
    # the plan's settings in place of the launching shell's (its ssh_config ...), as the launch reads them
    answers, unreached = read_routes(backend, hosts, master, environ=plan.backend.with_settings(environ), stop=stop)
    if unreached:  # the launch reaches them its own way (relays, mpirun's daemons, srun): it says how they failed
        answers = {h: a for h, a in answers.items() if h not in unreached}
        settled, found = settle(plan, answers, master=master, partial=True)
    else:
        settled, found = settle(plan, answers, master=master)
    errors = tuple(d for d in found if d.is_error)
    if errors:
        raise DiagnosticError(errors)
    return settled, found
