"""
``poprun vipu-server`` against malformed and slow clients: raw sockets on a real server process.

Every malformed request gets a 4xx status and a JSON error, the server never prints a traceback, a
client that sends one byte at a time stalls no one else, and the server answers normally after all.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


class Server:
    """``poprun vipu-server`` on a free port with a one-second request timeout."""

    def __init__(self, db: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "poprun.cli.main", "vipu-server", "--port", "0", "--db", str(db),
             "--request-timeout", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        self.port = int(line.split()[2].rsplit(":", 1)[1])

    def stop(self) -> str:
        """Stop the server; return what it wrote to standard error."""
        self.process.terminate()
        _, err = self.process.communicate(timeout=10)
        return err


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("vipu") / "vipu.sqlite")
    yield running
    err = running.stop()

    assert "Traceback" not in err, err
    assert "" == err


def exchange(port: int, raw: bytes, *, wait_s: float = 5) -> tuple[int, dict[str, str], object]:
    """Send ``raw`` on a new connection; return the answer's status, headers and JSON body."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as conn:
        conn.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, f"closed without an answer after {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        while len(body) < int(headers["content-length"]):
            chunk = conn.recv(65536)
            assert chunk
            body += chunk
    return int(lines[0].split()[1]), headers, json.loads(body)


def request(method: str, path: str, body: bytes = b"", *headers: str, length: str | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body) if length is None else length}",
            *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


CREATE = {"request": {"name": "p16", "size": 16}}


def create(**changes: object) -> bytes:
    doc = {**CREATE, **changes}
    return request("POST", "/v1/partitions", json.dumps(doc).encode())


MALFORMED = {
    "not JSON": (request("POST", "/v1/partitions", b"{request:"), 400, "$: not JSON"),
    "not UTF-8": (request("POST", "/v1/partitions", b'{"request": "\xff"}'), 400, "invalid UTF-8"),
    "nested without end": (request("POST", "/v1/partitions", b"[" * 60000), 400, "nested too deeply"),
    "a list body": (request("POST", "/v1/partitions", b"[1, 2]"), 400, "$: expected an object, got a list"),
    "no request": (request("POST", "/v1/partitions", b"{}"), 400, "$.request: missing"),
    "a size that is text": (create(request={"name": "p", "size": "16"}), 400,
                            "$.request.size: expected an integer from 1 to 2147483647, got a string"),
    "a size of 2**70": (create(request={"name": "p", "size": 2**70}), 400, "$.request.size: expected an integer"),
    "a NUL in the name": (create(request={"name": "p\x00", "size": 16}), 400, "$.request.name: control character"),
    "a name of 300 characters": (create(request={"name": "p" * 300, "size": 16}), 400,
                                 "$.request.name: expected 1 to 255 characters, got 300"),
    "an owner that is text": (create(owner="me"), 400, "$.owner: expected an object, got a string"),
    "a negative pid": (create(owner={"label": "a", "host": "h", "pid": -1}), 400, "$.owner.pid"),
    "a lease for ever": (create(ttl_s=1e308), 400, "$.ttl_s: expected seconds above 0 and at most 3600"),
    "a lease of no time": (create(ttl_s=0), 400, "$.ttl_s"),
    "a Content-Length that is not a number": (request("POST", "/v1/partitions", b"{}", length="abc"), 400,
                                              "Content-Length 'abc' is not one byte count"),
    "a negative Content-Length": (request("POST", "/v1/partitions", b"{}", length="-2"), 400,
                                  "Content-Length '-2' is not one byte count"),
    "two Content-Lengths": (request("POST", "/v1/partitions", b"{}", "Content-Length: 5"), 400,
                            "is not one byte count"),
    "a huge body announced": (request("POST", "/v1/partitions", b"{}", length="100000000"), 413,
                              "a body of 100000000 bytes is over the limit of 65536"),
    "a chunked body": (request("POST", "/v1/partitions", b"", "Transfer-Encoding: chunked"), 411,
                       "send the body with a Content-Length"),
    "a short body": (request("POST", "/v1/partitions", b"{}", length="10"), 408, "the body did not arrive within 1 s"),
    "an unknown path": (request("GET", "/v2/everything"), 404, "no route /v2/everything"),
    "a path with NUL": (request("GET", "/v1/partitions/a%00b"), 400, "control character"),
    "a method the route does not answer": (request("DELETE", "/v1/version"), 405, "DELETE is not allowed here"),
    "an unknown method": (request("PATCH", "/v1/partitions"), 405, "method PATCH is not allowed"),
    "a request line that is not HTTP": (b"HELLO THERE\r\n\r\n", 400, "Bad HTTP/0.9 request type"),
    "a header line too long": (b"GET /v1/version HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 431, "Line too long"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_request_gets_a_json_error(server, case):
    """Each malformed request: the documented status and a JSON error saying what is wrong."""
    raw, status, words = MALFORMED[case]
    got, headers, body = exchange(server.port, raw)

    assert (status, "application/json") == (got, headers["content-type"])
    assert isinstance(body, dict)
    assert words in body["message"], body


def test_the_server_still_answers_after_them(server):
    """After every malformed request above, a well-formed one is answered."""
    status, _, body = exchange(server.port, request("GET", "/v1/version"))

    assert (200, "poprun-emulated-vipu 1") == (status, body["version"])  # type: ignore[index]


def test_a_slow_client_does_not_stall_the_others(server):
    """A client trickling its request holds only its own connection, which is closed after the request timeout."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        slow.sendall(b"GET /v1/vers")
        status, _, _ = exchange(server.port, request("GET", "/v1/version"), wait_s=2)  # meanwhile, another client
        start, closed = time.monotonic(), False
        for _ in range(200):  # trickle one byte every 50 ms until the server has closed the connection
            try:
                slow.sendall(b"i")
            except OSError:
                closed = True
                break
            time.sleep(0.05)
        took = time.monotonic() - start

    assert (200, True) == (status, closed)
    assert took < 8  # the request timeout is 1 s in total; a per-read timeout would never fire


def test_an_idle_connection_is_closed(server):
    """A connection that sends nothing is closed after the request timeout (no thread waits for ever)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle:
        assert b"" == idle.recv(1)


@pytest.mark.parametrize(("args", "words"), [
    (["--port", "70000"], "--port 70000 must be from 0 to 65535"),
    (["--ipus", "1000000000000"], "--ipus 1000000000000 must be a positive multiple of --ild-size 16, at most 65536"),
    (["--request-timeout", "0"], "--request-timeout 0 must be above 0 and at most 3600 seconds"),
    (["--inventory", "inventory.json"], "cannot read the inventory inventory.json: JSONDecodeError"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, words):
    """The server's own bad arguments: one line naming the problem, exit 2, never an internal error."""
    (tmp_path / "inventory.json").write_text("[1", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "vipu-server", "--db", str(tmp_path / "db"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=20, check=False)

    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert words in done.stderr
