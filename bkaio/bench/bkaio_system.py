"""bkaio as a system under test: N real bookie processes on loopback, fsync on, and the client.

Metadata is the embedded SQLite store (default) or a local etcd process (`metadata="etcd"`).
Every bookie runs `python -m bkaio.bookie --config F` with one shard, in its own session; its
CPU is that of the parent plus the shard worker. The client lives in the harness process. Each
run writes a fresh ledger, and closes and deletes it afterwards so disk use stays bounded.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import structlog

from bkaio.bench.spec import Workload
from bkaio.bench.systems import BenchSetupError, ChildProcess, stop_all, wait_until
from bkaio.ledger_client import BookKeeper, LedgerHandle
from bkaio.localproc import LOOPBACK, EtcdProcess, free_port
from bkaio.meta import initialise_cluster_at
from bkaio.runtime_tuning import tune_gc_for_throughput

MetadataKind = Literal["embedded", "etcd"]
READY_TIMEOUT_SECONDS = 60.0
PASSWORD = b"bkaio-bench"

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class _Bookie:
    index: int
    port: int
    admin_port: int
    child: ChildProcess


class BkaioAppender:
    """One ledger: `send` is `LedgerHandle.append` (returns a future at once, no Task)."""

    def __init__(self, client: BookKeeper, handle: LedgerHandle) -> None:
        self._client = client
        self._handle = handle
        self.send: Callable[[bytes], Awaitable[Any]] = handle.append

    async def close(self) -> None:
        await self._handle.close()
        await self._client.delete_ledger(self._handle.ledger_id)


def _bookie_toml(directory: Path, port: int, admin_port: int, metadata_uri: str) -> str:
    return "\n".join(
        [
            "[bookie]",
            f'host = "{LOOPBACK}"',
            f"port = {port}",
            "shards = 1",
            "[metadata]",
            f'uri = "{metadata_uri}"',
            "registration_ttl_seconds = 5.0",
            "[admin]",
            f'host = "{LOOPBACK}"',
            f"port = {admin_port}",
            "[storage]",
            f'journal_dirs = ["{directory / "journal"}"]',
            f'ledger_dirs = ["{directory / "ledgers"}"]',
            "[journal]",
            "sync = true  # fdatasync before every ack: the durability being compared",
            "[log]",
            'level = "warning"  # Nothing per entry; keep the log off the measured CPU.',
            "",
        ]
    )


class BkaioSystem:
    """The bkaio cluster the harness measures; `name` is "bkaio"."""

    def __init__(
        self, base_dir: Path, *, bookies: int = 3, metadata: MetadataKind = "embedded"
    ) -> None:
        self.name = "bkaio"
        self.base_dir = base_dir
        self.metadata_kind: MetadataKind = metadata
        self.metadata_uri = ""
        self._bookie_count = bookies
        self._bookies: list[_Bookie] = []
        self._etcd: EtcdProcess | None = None
        self._client: BookKeeper | None = None

    async def start(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if self.metadata_kind == "etcd":
            self._etcd = EtcdProcess(self.base_dir / "etcd")
            try:
                await asyncio.to_thread(self._etcd.start)
            except (RuntimeError, TimeoutError) as error:
                raise BenchSetupError(f"bkaio: local etcd did not start: {error}") from None
            self.metadata_uri = f"etcd://{self._etcd.endpoint}/bkaio-bench"
        else:
            self.metadata_uri = f"sqlite://{(self.base_dir / 'meta.db').resolve()}"
        await initialise_cluster_at(self.metadata_uri, exist_ok=True)  # As standalone does.
        env = {**os.environ}
        env.pop("NOTIFY_SOCKET", None)
        for index in range(self._bookie_count):
            directory = (self.base_dir / f"bookie-{index}").resolve()
            directory.mkdir(parents=True, exist_ok=True)
            port, admin_port = free_port(), free_port()
            config = directory / "bookie.toml"
            config.write_text(_bookie_toml(directory, port, admin_port, self.metadata_uri))
            argv = [sys.executable, "-m", "bkaio.bookie", "--config", str(config)]
            child = ChildProcess(f"bookie-{index}", argv, directory / "bookie.log", env)
            child.spawn()
            self._bookies.append(_Bookie(index, port, admin_port, child))
        async with aiohttp.ClientSession() as session:
            for bookie in self._bookies:
                url = f"http://{LOOPBACK}:{bookie.admin_port}/api/v1/bookie/is_ready"
                await wait_until(
                    functools.partial(_http_ok, session, url),
                    what=f"bkaio bookie-{bookie.index}",
                    timeout_seconds=READY_TIMEOUT_SECONDS,
                    alive=bookie.child.check_alive,
                )
        self._client = await BookKeeper.connect(self.metadata_uri, client_id="bkaio-bench")
        tune_gc_for_throughput()  # What an application appending at high rates should do.

    async def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()
        try:
            await stop_all([bookie.child for bookie in self._bookies])
        finally:
            self._bookies.clear()
        if self._etcd is not None:
            etcd, self._etcd = self._etcd, None
            await asyncio.to_thread(etcd.stop)

    def server_pids(self) -> dict[str, int]:
        return {f"bookie-{b.index}": b.child.pid for b in self._bookies}

    def check_alive(self) -> None:
        for bookie in self._bookies:
            bookie.child.check_alive()

    async def open_appender(self, workload: Workload) -> BkaioAppender:
        assert self._client is not None, "start() first"
        handle = await self._client.create_ledger(
            ensemble_size=workload.ensemble,
            write_quorum=workload.write_quorum,
            ack_quorum=workload.ack_quorum,
            password=PASSWORD,
        )
        return BkaioAppender(self._client, handle)

    def describe(self) -> dict[str, Any]:
        return {
            "system": self.name,
            "metadata": self.metadata_uri,
            "bookies": [f"{LOOPBACK}:{b.port}" for b in self._bookies],
            "fsync": True,
        }


async def _http_ok(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=2.0)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
