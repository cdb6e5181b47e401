"""`free_port_range` never hands out a port twice in one process (servers of one cluster get
their ports before any of them binds)."""

from __future__ import annotations

from bkaio.testing.procs import free_port, free_port_range


def test_ports_handed_out_never_repeat_or_overlap() -> None:
    taken: set[int] = set()
    for count in (1, 2, 3, 1, 4) * 40:
        first = free_port_range(count)
        ports = set(range(first, first + count))
        assert not ports & taken
        taken |= ports
    assert free_port() not in taken
