"""`free_port_range` never hands out a port twice in one process (servers of one cluster get
their ports before any of them binds)."""

from __future__ import annotations

import socket

import pytest

from bkaio.testing.procs import free_port, free_port_range


def test_ports_handed_out_never_repeat_or_overlap() -> None:
    taken: set[int] = set()
    for count in (1, 2, 3, 1, 4) * 40:
        first = free_port_range(count)
        ports = set(range(first, first + count))
        assert not ports & taken
        taken |= ports
    assert free_port() not in taken


def test_a_port_window_bounds_what_is_handed_out() -> None:
    from bkaio import localproc

    saved = localproc._window
    lowest, _highest = localproc.port_limits()
    try:
        localproc.use_port_window(lowest + 100, lowest + 140)
        ports = [free_port() for _ in range(20)]
        assert all(lowest + 100 <= p < lowest + 140 for p in ports)
        with pytest.raises(ValueError, match="port window"):
            localproc.use_port_window(lowest - 1, lowest + 10)
    finally:
        localproc._window = saved


def test_a_base_port_hands_out_its_offsets_and_nothing_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`bkaio standalone --base-port`'s plan: a few ports over a span of 202, all in the window;
    the ports between them stay free for others."""
    from bkaio import localproc

    offsets = [0, 1, 100, 101, 200, 201]
    # A base inside this process's window (its own, under xdist) whose ports are free now: a
    # fixed one may be held by a server another test of this worker left running, or by a
    # connection in TIME_WAIT, and the plan would then rightly refuse it.
    start = localproc._window[0] + 500
    low = next(b for b in range(start, start + 203 * 50, 203) if _bindable(b, b + 202))
    monkeypatch.setattr(localproc, "_handed_out", set())
    monkeypatch.setattr(localproc, "_window", (low, low + 203))  # Room for one base: low.
    assert localproc.free_base_port(offsets) == low
    between = free_port()
    assert low + 2 <= between < low + 200 and between not in (low + 100, low + 101)
    with pytest.raises(RuntimeError, match="no free ports"):
        localproc.free_base_port(offsets)  # Its one base is handed out already.


def _bindable(first: int, last: int) -> bool:
    """Whether every port in [first, last] can be bound on loopback right now."""
    sockets: list[socket.socket] = []
    try:
        for port in range(first, last + 1):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
