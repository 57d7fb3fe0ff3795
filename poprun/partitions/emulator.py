"""
``poprun vipu-server``: the emulated V-IPU partition service, an HTTP/JSON server.

Layer: ``poprun.partitions``; the standard library, :mod:`poprun.partitions.store` and
:mod:`poprun.partitions.wire` (its routes are listed there).

A stand-in for Graphcore's V-IPU server, which cannot run here (design.md section 10): it
serves a fixed IPU inventory (``--ipus 64 --ild-size 16``: a Pod64), keeps its partitions and
leases in SQLite (``--db``) so that they survive a restart, and answers each request in its own
thread (``ThreadingHTTPServer``); SQLite transactions make every change atomic.

Run it with ``python -m poprun.partitions.emulator --port 0 --db vipu.sqlite``; it prints one
line, ``listening on HOST:PORT ...``, once it accepts connections, and stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import unquote

from poprun.partitions import wire
from poprun.partitions.provider import ProviderError
from poprun.partitions.store import DEFAULT_TTL_S, Inventory, Store


class EmulatorServer(ThreadingHTTPServer):
    """The HTTP server, holding its :class:`Store`."""

    daemon_threads = True

    def __init__(self, host: str, port: int, store: Store) -> None:
        super().__init__((host, port), _Handler)
        self.store = store

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when asked for 0)."""
        return int(self.server_address[1])

    def stop(self) -> None:
        """Stop serving (from another thread) and close the socket and the database."""
        self.shutdown()
        self.server_close()
        self.store.close()


class _Handler(BaseHTTPRequestHandler):
    server: EmulatorServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's names
        """Stay quiet: the emulator is used in tests and by poprun itself."""

    def do_GET(self) -> None:
        """Answer GET."""
        self._answer("GET")

    def do_POST(self) -> None:
        """Answer POST."""
        self._answer("POST")

    def do_PUT(self) -> None:
        """Answer PUT."""
        self._answer("PUT")

    def do_DELETE(self) -> None:
        """Answer DELETE."""
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            status, doc = _route(self.server.store, method, parts, body)
        except ProviderError as exc:
            kind = wire.kind_of(exc)
            status, doc = wire.ERRORS[kind][0], {"error": kind, "message": exc.message}
            holder = getattr(exc, "holder", None)
            if holder is not None:
                doc["holder"] = holder
        except (ValueError, KeyError, TypeError) as exc:
            status, doc = 400, {"error": "refused", "message": f"bad request: {exc}"}
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _route(store: Store, method: str, parts: list[str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Return the status and body for a request; provider errors propagate."""
    owner, ttl = wire.owner_from_json(body.get("owner")), float(body.get("ttl_s", DEFAULT_TTL_S))
    match method, parts:
        case "GET", ["v1", "version"]:
            inv = store.inventory
            return 200, {"version": wire.VERSION, "inventory": {"ipus": inv.ipus, "ild_size": inv.ild_size}}
        case "GET", ["v1", "partitions"]:
            return 200, {"partitions": [wire.info_to_json(i) for i in store.list()]}
        case "GET", ["v1", "partitions", name]:
            info = store.get(name)
            if info is None:
                return 404, {"error": "not_found", "message": f"partition {name} not found"}
            return 200, {"partition": wire.info_to_json(info)}
        case "POST", ["v1", "partitions"]:
            info = store.create(wire.request_from_json(body["request"]), owner=owner, ttl_s=ttl)
            return 201, {"partition": wire.info_to_json(info)}
        case "PUT", ["v1", "partitions", name]:
            request = wire.request_from_json({**body["request"], "name": name})
            return 200, {"partition": wire.info_to_json(store.update(request, owner=owner, ttl_s=ttl))}
        case "POST", ["v1", "partitions", name, "reset"]:
            return 200, {"partition": wire.info_to_json(store.reset(name))}
        case "DELETE", ["v1", "partitions", name]:
            store.remove(name, owner=owner)
            return 200, {}
        case "PUT", ["v1", "partitions", name, "lease"] if owner is not None:
            store.lease(name, owner, ttl_s=ttl)
            return 200, {}
        case "DELETE", ["v1", "partitions", name, "lease"] if owner is not None:
            store.release(name, owner)
            return 200, {}
    return 404, {"error": "refused", "message": f"no route {method} /{'/'.join(parts)}"}


def start(host: str, port: int, db_path: str, inventory: Inventory | None = None) -> EmulatorServer:
    """Return a running server (in a daemon thread); call its ``stop()`` when done."""
    server = EmulatorServer(host, port, Store(db_path, inventory))
    threading.Thread(target=server.serve_forever, name="vipu-emulator", daemon=True).start()
    return server


def serve(host: str, port: int, db_path: str, inventory: Inventory | None = None, *,
          ready: Callable[[EmulatorServer], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (in the main thread) or ``shutdown()``; ``ready`` is called once listening."""
    server = EmulatorServer(host, port, Store(db_path, inventory))

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    if ready is not None:
        ready(server)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        server.store.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="poprun vipu-server", description="An emulated V-IPU partition service "
                                     "(HTTP/JSON, state in SQLite) for offline use and tests.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="port to listen on; 0 picks a free one (default 8090)")
    parser.add_argument("--db", default="vipu-server.sqlite", help="SQLite file of the partitions (made if missing)")
    parser.add_argument("--ipus", type=int, default=64, help="IPUs of the inventory (default 64, a Pod64)")
    parser.add_argument("--ild-size", type=int, default=16, help="IPUs per IPU-Link domain (default 16)")
    parser.add_argument("--inventory", help="a JSON inventory file (ipus, ild_size, partitions, faults)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; return its exit status (0 after SIGINT/SIGTERM, 2 for bad arguments)."""
    args = _parser().parse_args(argv)
    if args.ipus < 1 or args.ild_size < 1 or args.ipus % args.ild_size:
        sys.stderr.write(f"poprun vipu-server: --ipus {args.ipus} must be a positive multiple of --ild-size "
                         f"{args.ild_size}\n")
        return 2
    inventory = Inventory.from_file(args.inventory) if args.inventory else Inventory(
        ipus=args.ipus, ild_size=args.ild_size)

    def ready(server: EmulatorServer) -> None:
        inv = server.store.inventory
        sys.stdout.write(f"listening on {args.host}:{server.port} (database {args.db}: {inv.ipus} IPUs in ILDs "
                         f"of {inv.ild_size})\n")
        sys.stdout.flush()

    try:
        serve(args.host, args.port, args.db, inventory, ready=ready)
    except OSError as exc:
        sys.stderr.write(f"poprun vipu-server: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}\n")
        return 1
    except sqlite3.Error as exc:
        sys.stderr.write(f"poprun vipu-server: cannot use the database {args.db}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
