"""Local child processes on loopback: free ports, waiting for a port, stopping a process, and a
single-member etcd (`EtcdProcess`).

Used by `bkaio standalone` (its `--etcd` store and ports), the benchmark systems (bkaio/bench)
and, through `bkaio.testing.procs`, by tests. Synchronous on purpose: callers use it outside any
event loop (command set-up, fixtures). Nothing of a bookie or a client imports it.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"


# Servers started by tests get ports below the kernel's ephemeral range. Every outgoing
# connection (an etcd client, an HTTP readiness poll) takes its local port from that range, so a
# port picked there with bind(0) could be taken by such a connection before the server binds it
# ("address already in use" at start-up, seen in the fault soak).
_LOWEST_PORT = 10_000
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default.


# The ports this process hands out: [low, high), high None = up to the ephemeral range.
_window: tuple[int, int | None] = (_LOWEST_PORT, None)


def port_limits() -> tuple[int, int]:
    """The ports this module may hand out on this machine: [low, high)."""
    return _LOWEST_PORT, _ephemeral_low()


def use_port_window(low: int, high: int) -> None:
    """Hand out ports in [low, high) only. Processes that pick ports at the same time on one
    machine (parallel test workers) each take their own window, so that neither hands out the
    port the other is about to bind."""
    if not _LOWEST_PORT <= low < high <= _ephemeral_low():
        raise ValueError(
            f"port window [{low}, {high}) must lie in [{_LOWEST_PORT}, {_ephemeral_low()})"
        )
    global _window
    _window = (low, high)


# Ports this process handed out: never handed out twice. Several servers get their ports
# before any of them binds (a cluster's bookies start together), so "free right now" alone
# once gave one bookie's admin port to another bookie's data port.
_handed_out: set[int] = set()


def free_port_range(count: int = 1, host: str = LOOPBACK) -> int:
    """A first port such that `count` consecutive ports are free right now, outside the
    ephemeral range and never handed out before by this process (another process may still
    take them: callers that can, retry)."""
    return free_base_port(range(count), host)


def free_base_port(offsets: Sequence[int], host: str = LOOPBACK) -> int:
    """A port BASE such that BASE + each of `offsets` (>= 0) is free right now, in this
    process's window and never handed out before by it; those ports are handed out, the ones
    between them are not (`bkaio standalone --base-port`'s plan spans 202 ports, uses a few)."""
    low, high = _window
    span = max(offsets) + 1
    highest_first = (_ephemeral_low() if high is None else high) - span
    if highest_first <= low:
        raise RuntimeError(f"no room for {span} ports in [{low}, {high or 'ephemeral'}) on {host}")
    for _ in range(200):
        first = random.randrange(low, highest_first)
        ports = [first + offset for offset in offsets]
        if not _handed_out.isdisjoint(ports):
            continue
        sockets: list[socket.socket] = []
        try:
            for port in ports:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((host, port))
            _handed_out.update(ports)
            return first
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no free ports at {sorted(set(offsets))} from any base on {host}")


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (another process may still take it: retry)."""
    return free_port_range(1, host)


def port_is_open(host: str, port: int, timeout_seconds: float = 0.2) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout_seconds):
        return True
    return False


def wait_for_port(
    host: str,
    port: int,
    *,
    timeout_seconds: float = 10.0,
    process: subprocess.Popen[bytes] | None = None,
) -> None:
    """Block until something accepts TCP connections on host:port.

    TimeoutError after `timeout_seconds`; RuntimeError at once if `process` exits meanwhile.
    """
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process {process.args!r} exited with {process.returncode}")
        if port_is_open(host, port):
            return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_seconds} s")


def stop_process(process: subprocess.Popen[bytes], *, timeout_seconds: float = 5.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_seconds`; always reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """kill -9 and reap."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def etcd_binary() -> str | None:
    return (
        os.environ.get("BKAIO_ETCD")
        or shutil.which("etcd")
        or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    )


class EtcdProcess:
    """One single-member etcd on loopback with its own data dir; restartable on the same ports."""

    def __init__(self, data_dir: Path, *, binary: str | None = None) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise RuntimeError("etcd not found: install etcd-server or set BKAIO_ETCD")
        self.binary = found
        self.data_dir = data_dir
        self.client_port = 0
        self.peer_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._log_path = data_dir.parent / f"{data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"{LOOPBACK}:{self.client_port}"

    def _command(self) -> list[str]:
        client_url = f"http://{LOOPBACK}:{self.client_port}"
        peer_url = f"http://{LOOPBACK}:{self.peer_port}"
        return [
            self.binary,
            "--name=bkaio-test",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=bkaio-test={peer_url}",
            # A single member elects itself after one election timeout: keep it short.
            "--heartbeat-interval=20",
            "--election-timeout=200",
            "--log-level=error",
            "--logger=zap",
        ]

    def start(self, *, attempts: int = 5) -> None:
        """Start (or restart, on the same ports and data dir) and wait until it serves."""
        assert self.process is None or self.process.poll() is not None, "already running"
        first_start = not self.client_port  # A restart keeps its ports: clients reconnect.
        for _ in range(attempts):
            if first_start:
                self.client_port, self.peer_port = free_port(), free_port()
            with self._log_path.open("ab") as log_file:
                self.process = subprocess.Popen(
                    self._command(), stdout=log_file, stderr=subprocess.STDOUT
                )
            try:
                wait_for_port(LOOPBACK, self.client_port, timeout_seconds=15, process=self.process)
                self._wait_ready()
                return
            except (RuntimeError, TimeoutError):
                kill_process(self.process)  # Most likely a port was taken meanwhile.
                time.sleep(0.2)
        raise RuntimeError(f"etcd did not start; see {self._log_path}")

    def _wait_ready(self, timeout_seconds: float = 15.0) -> None:
        """The port opens before a leader exists; /health says when requests will succeed."""
        import urllib.request

        deadline = time.monotonic() + timeout_seconds
        url = f"http://{self.endpoint}/health"
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
                if b'"true"' in response.read():
                    return
            time.sleep(0.02)
        raise TimeoutError(f"etcd at {self.endpoint} not healthy after {timeout_seconds} s")

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def kill(self) -> None:
        if self.process is not None:
            kill_process(self.process)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None
