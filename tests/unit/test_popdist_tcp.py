"""popdist's TCP backend (rendezvous and barriers), instances played by threads of this process on loopback."""

import socket
import threading
import time
from collections.abc import Callable

import pytest

from popdist import _rendezvous, _tcp
from popdist._backend import BackendError

pytestmark = pytest.mark.timeout(30)


def free_port() -> int:
    """Return a TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_instances(count: int, body: Callable[[int, object], object], *, timeout_s: float = 10.0) -> list[object]:
    """Open ``count`` instances in threads, run ``body(index, backend)`` in each; return results (or exceptions)."""
    port = free_port()
    results: list[object] = [None] * count

    def instance(index: int) -> None:
        backend = None
        try:
            backend = _rendezvous.open_tcp(index=index, count=count, host="localhost", port=port, timeout_s=timeout_s)
            results[index] = body(index, backend)
        except Exception as exc:  # noqa: BLE001 - reported to the test as a value
            results[index] = exc
        finally:
            if backend is not None:  # what a process's exit does: drop the connections, without a barrier
                backend._broken = True
                backend.close()

    threads = [threading.Thread(target=instance, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return results


def test_instances_meet_and_wait_for_each_other():
    """A barrier returns nowhere before the slowest instance has arrived."""
    arrived: list[float] = []

    def body(index, backend):
        time.sleep(0.2 if index == 2 else 0.0)
        arrived.append(time.monotonic())
        backend.barrier(frozenset(range(3)), 10)
        left = time.monotonic()
        backend.close()
        return left >= max(arrived)

    assert [True, True, True] == run_instances(3, body)


def test_a_group_barrier_completes_while_instance_0_waits_elsewhere():
    """Instances 1 and 2 meet among themselves, relayed by instance 0 while it waits for everyone."""
    order: list[str] = []

    def body(index, backend):
        if index in {1, 2}:
            time.sleep(0.1)
            backend.barrier(frozenset({1, 2}), 10)
            order.append(f"group {index}")
        backend.barrier(frozenset(range(4)), 10)
        order.append(f"all {index}")
        backend.close()

    assert [None] * 4 == run_instances(4, body)
    assert {"group 1", "group 2"} == set(order[:2])


def test_an_instance_that_leaves_fails_the_barrier_of_the_others():
    """When an instance closes its connection, instance 0's barrier raises, and then instance 2's."""

    def body(index, backend):
        if index == 1:
            backend._link.sock.close()
            return "left"
        backend.barrier(frozenset(range(3)), 10)
        return "passed"

    results = run_instances(3, body)

    assert "left" == results[1]
    assert "instance 1 left (it exited or failed) while instance 0 waited" in str(results[0])
    assert "instance 0 left (it exited, failed or gave up) while instance 2 waited" in str(results[2])


def test_a_failed_backend_refuses_further_barriers():
    """After a barrier failed, the next one says so instead of hanging or misreporting."""

    def body(index, backend):
        if index == 1:
            backend._link.sock.close()
            return
        with pytest.raises(BackendError, match="left"):
            backend.barrier(frozenset(range(2)), 10)
        backend.barrier(frozenset(range(2)), 10)

    assert "failed earlier, so it cannot hold a barrier" in str(run_instances(2, body)[0])


def test_instances_waiting_for_a_missing_one_are_told_when_instance_0_gives_up():
    """When an instance never joins, instance 0 gives up and the instances that did join hear of it at once."""
    port = free_port()
    errors: list[BackendError] = []

    def join(index: int, timeout_s: float) -> None:
        try:
            _rendezvous.open_tcp(index=index, count=3, host="localhost", port=port, timeout_s=timeout_s)
        except BackendError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(0, 0.5)), threading.Thread(target=join, args=(1, 10))]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    for thread in threads:
        thread.join(10)

    messages = sorted(str(e) for e in errors)
    assert time.monotonic() - started < 5
    assert 2 == len(messages)
    assert "before every instance had joined (it gave up waiting, or failed)" in messages[0]
    assert "for instances [2], which did not join" in messages[1]


def test_a_barrier_times_out():
    """A barrier with a timeout gives up, naming the instances it still waits for."""

    def body(index, backend):
        if index == 0:
            backend.barrier(frozenset(range(2)), 0.2)
        time.sleep(0.5)

    assert "timed out waiting for instances [1]" in str(run_instances(2, body)[0])


def test_instance_0_gives_up_when_nobody_joins():
    """The rendezvous has a deadline, and the error names the missing instances."""
    with pytest.raises(BackendError, match=r"waited 0.2 s .* for instances \[1, 2\], which did not join"):
        _rendezvous.open_tcp(index=0, count=3, host="localhost", port=free_port(), timeout_s=0.2)


def test_an_instance_gives_up_when_instance_0_is_not_there():
    """A spoke retries until the deadline, then says where it looked."""
    with pytest.raises(BackendError, match=r"could not reach instance 0 at 127.0.0.1 port \d+ within 0.2 s"):
        _rendezvous.open_tcp(index=1, count=2, host="localhost", port=free_port(), timeout_s=0.2)


def test_a_busy_port_says_which_variable_to_change():
    """When the port is taken, instance 0 says to pick another MASTER_PORT."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(BackendError, match=r"in use .* set MASTER_PORT to a free port"):
            _rendezvous.open_tcp(index=0, count=2, host="localhost", port=port, timeout_s=1)


def test_an_instance_of_another_launch_is_refused():
    """A hello for a launch of another size is refused with the reason, not admitted."""
    port = free_port()

    def lonely_hub() -> None:
        with pytest.raises(BackendError, match="did not join"):
            _rendezvous.open_tcp(index=0, count=2, host="localhost", port=port, timeout_s=0.5)

    hub = threading.Thread(target=lonely_hub)
    hub.start()

    with pytest.raises(BackendError, match="this launch has 2 instances, not 3"):
        _rendezvous.open_tcp(index=1, count=3, host="localhost", port=port, timeout_s=0.5)
    hub.join()


def test_something_else_on_the_port_is_skipped():
    """A service answering garbage at MASTER_ADDR (an HTTP proxy) is skipped for the next address."""
    port = free_port()
    with socket.create_server(("127.0.0.2", port)) as proxy:
        def answer_http():
            conn, _ = proxy.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_http).start()
        hub: list[object] = []
        threading.Thread(target=lambda: hub.append(_rendezvous.open_tcp(index=0, count=2, host="localhost", port=port,
                                                                  timeout_s=5))).start()
        link = _rendezvous._join(["127.0.0.2", "127.0.0.1"], port, index=1, count=2, deadline=time.monotonic() + 5,
                          timeout_s=5)

    spoke = _tcp.TcpSpoke(link, 1, 2)
    closing = threading.Thread(target=spoke.close)
    closing.start()
    _wait_for(lambda: bool(hub))
    hub[0].close()  # type: ignore[attr-defined]
    closing.join(5)
    assert not closing.is_alive()


def test_unresolvable_master_addr_falls_back_on_loopback():
    """A planned host name that does not resolve (multi-host offline) still meets on 127.0.0.1."""
    assert ["127.0.0.1"] == _rendezvous._addresses("no-such-host.invalid")
    assert ["127.0.0.2", "127.0.0.1"] == _rendezvous._addresses("127.0.0.2")


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
