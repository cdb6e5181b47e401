"""A 3-member etcd cluster on loopback for metadata faults (F14 soak variant).

Each member is an `EtcdProcess`-like child with its own data dir and ports; `kill(i)`,
`start(i)`, `stop_all()`. Synchronous (call through asyncio.to_thread)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from pathlib import Path

from bkaio.testing.procs import LOOPBACK, etcd_binary, free_port, kill_process, wait_for_port


class EtcdCluster:
    def __init__(self, base_dir: Path, members: int = 3) -> None:
        binary = etcd_binary()
        assert binary is not None, "etcd not installed"
        self.binary = binary
        self.base_dir = base_dir
        self.names = [f"m{i}" for i in range(members)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * members

    @property
    def endpoints(self) -> list[str]:
        return [f"{LOOPBACK}:{port}" for port in self.client_ports]

    def uri(self, prefix: str) -> str:
        return "etcd://" + ",".join(self.endpoints) + prefix

    def _command(self, i: int) -> list[str]:
        peers = ",".join(
            f"{name}=http://{LOOPBACK}:{port}"
            for name, port in zip(self.names, self.peer_ports, strict=True)
        )
        return [
            self.binary,
            f"--name={self.names[i]}",
            f"--data-dir={self.base_dir / self.names[i]}",
            f"--listen-client-urls=http://{LOOPBACK}:{self.client_ports[i]}",
            f"--advertise-client-urls=http://{LOOPBACK}:{self.client_ports[i]}",
            f"--listen-peer-urls=http://{LOOPBACK}:{self.peer_ports[i]}",
            f"--initial-advertise-peer-urls=http://{LOOPBACK}:{self.peer_ports[i]}",
            f"--initial-cluster={peers}",
            "--initial-cluster-state=new",
            "--heartbeat-interval=50",
            "--election-timeout=500",
            "--log-level=error",
            "--logger=zap",
        ]

    def start(self, i: int) -> None:
        log = (self.base_dir / f"{self.names[i]}.log").open("ab")
        with log:
            self.processes[i] = subprocess.Popen(self._command(i), stdout=log, stderr=log)
        wait_for_port(LOOPBACK, self.client_ports[i], timeout_seconds=20, process=self.processes[i])

    def start_all(self) -> None:
        for i in range(len(self.names)):
            log = (self.base_dir / f"{self.names[i]}.log").open("ab")
            with log:
                self.processes[i] = subprocess.Popen(self._command(i), stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.leader() is not None:
                return
            time.sleep(0.1)
        raise TimeoutError("etcd cluster elected no leader")

    def leader(self) -> int | None:
        """Index of the member that says it is the leader (v3 maintenance status)."""
        for i, port in enumerate(self.client_ports):
            if self.processes[i] is None:
                continue
            with contextlib.suppress(OSError, ValueError, KeyError):
                request = urllib.request.Request(
                    f"http://{LOOPBACK}:{port}/v3/maintenance/status", data=b"{}", method="POST"
                )
                with urllib.request.urlopen(request, timeout=1) as response:
                    status = json.loads(response.read())
                if status["header"]["member_id"] == status["leader"]:
                    return i
        return None

    def kill(self, i: int) -> None:
        process = self.processes[i]
        if process is not None:
            kill_process(process)
            self.processes[i] = None

    def stop_all(self) -> None:
        for i in range(len(self.names)):
            self.kill(i)
