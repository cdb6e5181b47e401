"""`free_port_range` never hands out a port twice in one process (servers of one cluster get
their ports before any of them binds)."""

from __future__ import annotations

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
