"""Child processes on loopback for tests: the production helpers of `bkaio.localproc`, under
the name tests have always used (free ports, waiting for a port, stopping, `EtcdProcess`)."""

from __future__ import annotations

from bkaio.localproc import (
    LOOPBACK,
    EtcdProcess,
    etcd_binary,
    free_base_port,
    free_port,
    free_port_range,
    kill_process,
    port_is_open,
    stop_process,
    wait_for_port,
)

__all__ = [
    "LOOPBACK",
    "EtcdProcess",
    "etcd_binary",
    "free_base_port",
    "free_port",
    "free_port_range",
    "kill_process",
    "port_is_open",
    "stop_process",
    "wait_for_port",
]
