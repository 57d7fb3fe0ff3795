"""
``poprun vipu-server``: the emulated V-IPU partition service, an HTTP/JSON server.

Layer: ``poprun.partitions``; the standard library, :mod:`poprun.partitions.store` and
:mod:`poprun.partitions.wire` (its routes are listed there); its options are rows of
:mod:`poprun.partitions.serveroption`, read by the flags parser (``poprun.planner.flags``).

A stand-in for Graphcore's V-IPU server, which cannot run here (design.md section 10): it
serves a fixed IPU inventory (``--ipus 64 --ild-size 16``: a Pod64), keeps its partitions and
leases in SQLite (``--db``) so that they survive a restart, and answers each connection in its
own thread (``ThreadingHTTPServer``); SQLite transactions make every change atomic.

Its clients are untrusted: each request must arrive within ``--request-timeout`` seconds in
total, and its answer leave within as long again (a client that sends one byte at a time holds
only its own thread, and only that long); a body is at most 64 KiB with an exact
Content-Length; every malformed request (bad JSON, wrong shape, unknown path or method) is answered with a 4xx status
and a JSON error, never a traceback; and a lease is renewed, released or overridden only with
the secret token granted to its holder (see :mod:`poprun.partitions.wire`).

Run it with ``python -m poprun.partitions.emulator --port 0 --db vipu.sqlite``; it prints one
line, ``listening on HOST:PORT ...``, once it accepts connections, and stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import sys
import threading
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any
from urllib.parse import unquote

from poprun.core.threads import spawn
from poprun.partitions import wire
from poprun.partitions.deadline import DeadlineSocket
from poprun.partitions.provider import PartitionInfo, ProviderError
from poprun.partitions.serveroption import REQUEST_TIMEOUT_S, ServerOptions
from poprun.partitions.store import DEFAULT_TTL_S, Inventory, Store

MAX_REQUEST = 64 * 1024  # bytes of a request's body
MAX_IPUS = 65536  # IPUs of an inventory: a thousand Pod64s, and a bound on every placement loop
# Each route's path shape -> the methods it answers; anything else is 404 or 405.
_ROUTES: tuple[tuple[tuple[str | None, ...], tuple[str, ...]], ...] = (
    (("v1", "version"), ("GET",)),
    (("v1", "partitions"), ("GET", "POST")),
    (("v1", "partitions", None), ("GET", "PUT", "DELETE")),
    (("v1", "partitions", None, "reset"), ("POST",)),
    (("v1", "partitions", None, "lease"), ("PUT", "DELETE")),
)


class Refusal(Exception):  # noqa: N818 - an answer, not a failure of the server
    """A request refused before it reaches the store: an HTTP status and the reason."""

    def __init__(self, status: int, kind: str, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.close = status, kind, message, close


class EmulatorServer(ThreadingHTTPServer):
    """The HTTP server, holding its :class:`Store`; one thread per connection, each with a deadline per request."""

    daemon_threads = True

    def __init__(self, host: str, port: int, store: Store, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        super().__init__((host, port), _Handler)
        self.store = store
        self.request_timeout_s = request_timeout_s

    @property
    def port(self) -> int:
        """The port it listens on (the one picked when asked for 0)."""
        return int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept a connection as a DeadlineSocket (every request on it gets ``request_timeout_s`` in total)."""
        sock, address = super().get_request()
        return DeadlineSocket.adopt(sock), address

    def handle_error(self, request: object, client_address: Any) -> None:  # noqa: ARG002 - the base class signature
        """Say in one line what went wrong with a connection (a client that went away: nothing); never a traceback."""
        kind, exc, _ = sys.exc_info()
        if exc is None or isinstance(exc, OSError):
            return
        sys.stderr.write(f"poprun vipu-server: a request from {client_address[0]} failed: "
                         f"{kind.__name__ if kind else 'error'}: {wire.printable(str(exc), 200)}\n")

    def stop(self) -> None:
        """Stop serving (from another thread) and close the socket and the database."""
        self.shutdown()
        self.server_close()
        self.store.close()


class _Handler(BaseHTTPRequestHandler):
    server: EmulatorServer
    connection: DeadlineSocket
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"  # answer even a request line that is not HTTP with a status line

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's names
        """Stay quiet: the emulator is used in tests and by poprun itself."""

    def handle_one_request(self) -> None:
        """Read one request within the server's request timeout (its answer then has as long again), and answer it."""
        self.connection.start(self.server.request_timeout_s)
        super().handle_one_request()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer an error of the HTTP layer (bad request line, header too long, unknown method) in JSON."""
        if code == HTTPStatus.NOT_IMPLEMENTED:  # a method no route answers
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, f"method {self.command} is not allowed"
        kind = {404: "no_route", 405: "not_allowed", 408: "timeout", 413: "too_large"}.get(code, "bad_request")
        self.close_connection = True
        self._send(code, {"error": kind, "message": message or explain or "bad request"})

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
        try:
            body = self._body()
            status, doc = _route(self.server.store, method, parts, body)
        except Refusal as exc:
            status, doc = exc.status, {"error": exc.kind, "message": exc.message}
            self.close_connection = self.close_connection or exc.close
        except ProviderError as exc:
            kind = wire.kind_of(exc)
            status, doc = wire.ERRORS[kind][0], {"error": kind, "message": exc.message}
            holder = getattr(exc, "holder", None)
            if holder is not None:
                doc["holder"] = holder
        except wire.ShapeError as exc:
            status, doc = 400, {"error": "bad_request", "message": f"bad request: {exc}"}
        except sqlite3.Error as exc:
            status, doc = 503, {"error": "unavailable", "message": f"the database failed: {exc}"}
        self._send(status, doc)

    def _body(self) -> dict[str, Any]:
        """Return the request's JSON object body ({} when empty). Raises Refusal, ShapeError."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise Refusal(411, "bad_request", "send the body with a Content-Length (no Transfer-Encoding)", close=True)
        lengths = self.headers.get_all("Content-Length") or ["0"]
        text = lengths[0].strip()
        if len(lengths) > 1 or not (text.isascii() and text.isdigit()) or len(text) > 12:  # noqa: PLR2004
            given = wire.printable(", ".join(lengths), 60)
            raise Refusal(400, "bad_request", f"Content-Length '{given}' is not one byte count", close=True)
        length = int(text)
        if length > MAX_REQUEST:
            raise Refusal(413, "too_large", f"a body of {length} bytes is over the limit of {MAX_REQUEST}",
                          close=True)
        try:
            raw = self.rfile.read(length)
        except TimeoutError:
            raise Refusal(408, "timeout", f"the body did not arrive within {self.server.request_timeout_s:g} s",
                          close=True) from None
        if len(raw) < length:
            raise Refusal(400, "bad_request", f"the body ended after {len(raw)} of {length} bytes", close=True)
        return wire.expect_object(wire.parse_json(raw), "$") if raw else {}

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        self.connection.start(self.server.request_timeout_s)  # the answer has its own time, even after a timeout
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            self.send_header("Allow", ", ".join(_allowed(self._parts()) or ()))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _parts(self) -> list[str]:
        return [unquote(p) for p in (self.path or "").split("?")[0].strip("/").split("/")]


def _allowed(parts: list[str]) -> tuple[str, ...] | None:
    """Return the methods the path answers, or None when no route has its shape."""
    for shape, methods in _ROUTES:
        if len(shape) == len(parts) and all(want in (None, got) for want, got in zip(shape, parts, strict=True)):
            return methods
    return None


def _route(store: Store, method: str, parts: list[str], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Return the status and body for a request; provider errors and ShapeError propagate."""
    allowed = _allowed(parts)
    if allowed is None:
        raise Refusal(404, "no_route", f"no route /{wire.printable('/'.join(parts), 200)}")
    if method not in allowed:
        raise Refusal(405, "not_allowed", f"{method} is not allowed here (allowed: {', '.join(allowed)})")
    name = wire.check_text(parts[2], "the partition name in the path", limit=wire.MAX_NAME) if len(parts) > 2 else ""  # noqa: PLR2004
    ttl, token = wire.ttl_from_json(body, DEFAULT_TTL_S), wire.token_from_json(body)
    match method, parts[2:]:
        case "GET", [] if parts[1] == "version":
            inv = store.inventory
            return 200, {"version": wire.VERSION, "inventory": {"ipus": inv.ipus, "ild_size": inv.ild_size}}
        case "GET", []:
            return 200, {"partitions": [wire.info_to_json(i) for i in store.list()]}
        case "GET", [_]:
            info = store.get(name)
            if info is None:
                return 404, {"error": "not_found", "message": f"partition {name} not found"}
            return 200, {"partition": wire.info_to_json(info)}
        case "POST", []:
            request = wire.request_from_json(wire.member(body, "request", "$"))
            info, granted = store.create_as(request, owner=wire.owner_from_json(body.get("owner")), ttl_s=ttl)
            return 201, _granted(info, granted)
        case "PUT", [_]:
            fields = wire.expect_object(wire.member(body, "request", "$"), "$.request")
            request = wire.request_from_json({**fields, "name": name})
            info, granted = store.update_as(request, owner=wire.owner_from_json(body.get("owner")), token=token,
                                            ttl_s=ttl)
            return 200, _granted(info, granted)
        case "POST", [_, "reset"]:
            return 200, {"partition": wire.info_to_json(store.reset(name))}
        case "DELETE", [_]:
            store.remove_as(name, token=token)
            return 200, {}
        case "PUT", [_, "lease"]:
            owner = wire.owner_from_json(wire.member(body, "owner", "$"))
            if owner is None:
                raise wire.ShapeError("$.owner", "expected an object, got null")
            return 200, {"token": store.lease_as(name, owner, token=token, ttl_s=ttl)}
        case "DELETE", [_, "lease"]:
            store.release_as(name, token=token)
            return 200, {}
    raise Refusal(404, "no_route", f"no route {method} /{wire.printable('/'.join(parts), 200)}")


def _granted(info: PartitionInfo, token: str | None) -> dict[str, Any]:
    """Return the answer to a request that may grant a lease: the token goes to the requester alone."""
    return {"partition": wire.info_to_json(info), **({} if token is None else {"token": token})}


def start(host: str, port: int, db_path: str, inventory: Inventory | None = None, *,
          request_timeout_s: float = REQUEST_TIMEOUT_S) -> EmulatorServer:
    """Return a running server (in a daemon thread); call its ``stop()`` when done."""
    server = EmulatorServer(host, port, Store(db_path, inventory), request_timeout_s=request_timeout_s)
    spawn(server.serve_forever, name="vipu-emulator")
    return server


def serve(host: str, port: int, db_path: str, inventory: Inventory | None = None, *,
          ready: Callable[[EmulatorServer], None] | None = None, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
    """Serve until SIGINT/SIGTERM (in the main thread) or ``shutdown()``; ``ready`` is called once listening."""
    server = EmulatorServer(host, port, Store(db_path, inventory), request_timeout_s=request_timeout_s)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        spawn(server.shutdown)

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


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the server as ``python -m poprun.partitions.emulator ARGV``; return its exit status.

    0 after SIGINT/SIGTERM (and for ``--help``), 1 when it cannot listen or use its database, 2
    for bad arguments: a diagnostic of the options (one line each here; ``poprun vipu-server``
    shows them with their carets) or a value out of range.
    """
    from poprun.core.diagnostic import DiagnosticError
    from poprun.partitions.serveroption import OPTIONS, USAGE, parse_server_options
    from poprun.planner.flags import describe_options

    try:
        args = parse_server_options(sys.argv[1:] if argv is None else argv)
    except DiagnosticError as exc:
        for problem in exc.diagnostics:
            sys.stderr.write(f"poprun vipu-server: error[{problem.code}]: {problem.summary}: {problem.detail} "
                             f"({problem.hint})\n")
        return 2
    if args is None:
        sys.stdout.write(describe_options((USAGE,), OPTIONS))
        return 0
    return run(args)


def run(args: ServerOptions) -> int:
    """Run the server with ``args`` until SIGINT or SIGTERM; return its exit status (0; 1 cannot listen; 2 out of range)."""
    if not 0 <= args.port <= 65535:  # noqa: PLR2004 - the TCP port range
        sys.stderr.write(f"poprun vipu-server: --port {args.port} must be from 0 to 65535\n")
        return 2
    if not 1 <= args.ild_size <= args.ipus <= MAX_IPUS or args.ipus % args.ild_size:
        sys.stderr.write(f"poprun vipu-server: --ipus {args.ipus} must be a positive multiple of --ild-size "
                         f"{args.ild_size}, at most {MAX_IPUS}\n")
        return 2
    if not 0 < args.request_timeout <= 3600:  # noqa: PLR2004 - an hour: longer is surely a mistake
        sys.stderr.write(f"poprun vipu-server: --request-timeout {args.request_timeout:g} must be above 0 and at "
                         "most 3600 seconds\n")
        return 2
    try:
        inventory = Inventory.from_file(args.inventory) if args.inventory else Inventory(
            ipus=args.ipus, ild_size=args.ild_size)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"poprun vipu-server: cannot read the inventory {args.inventory}: {why}\n")
        return 2

    def ready(server: EmulatorServer) -> None:
        inv = server.store.inventory
        sys.stdout.write(f"listening on {args.host}:{server.port} (database {args.db}: {inv.ipus} IPUs in ILDs "
                         f"of {inv.ild_size})\n")
        sys.stdout.flush()

    try:
        serve(args.host, args.port, args.db, inventory, ready=ready, request_timeout_s=args.request_timeout)
    except OSError as exc:
        sys.stderr.write(f"poprun vipu-server: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}\n")
        return 1
    except sqlite3.Error as exc:
        sys.stderr.write(f"poprun vipu-server: cannot use the database {args.db}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
