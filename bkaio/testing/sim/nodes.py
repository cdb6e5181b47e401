"""Simulated machines: a bookie (real shard storage, journal and server) and a client.

`SimBookie` is one machine with one disk (`SimDisk` over its own directory) running one bookie
process of one shard. `start()` builds what `bkaio.bookie.worker` builds, from that disk, with
the production code: `ShardStorage.open` (cookies, LMDB index, entry logs, journal replay,
checkpoint) with a real `Journal`, then a `ShardServer` whose connections are real
`BookieServerProtocol`s on the simulated network, and a registration in the metadata store
under a lease. The only parts that differ are the seams: the disk, the threads (simulated, so
the writer thread's and the storage thread's work runs on the loop), the crash points and the
journal's ack policy (a mutation check's). As in the worker, a journal that fails ends the
process (`bkaio.bookie.worker` exits 3 and its service manager restarts it) and a failed
storage flush makes the server read-only until a flush works again. `crash()` kills the
process (optionally with the machine's power: unsynced writes are lost); `start()` again is a
restart from the same disk.

`SimClient` is one application process holding a real `BookKeeper` (its `BookiePool` connects
through the simulated network, its metadata through an in-memory connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bkaio.bookie.connection import BookieServerProtocol
from bkaio.bookie.metrics import ShardMetrics
from bkaio.bookie.server import ShardServer
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import BKError
from bkaio.journal import Journal, JournalConfig
from bkaio.journal.crash_points import NO_CRASH_POINTS, CrashPoints
from bkaio.journal.writer import ACK_AFTER_SYNC, JournalAckPolicy
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.recovery import FENCED_RECOVERY_READS, RecoveryReadPolicy
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import Metadata
from bkaio.meta.bookies import BookieInfo, BookieRegistration
from bkaio.security.ledger_keys import KeySource, LedgerKeyVerifier, MetadataKeySource
from bkaio.testing.sim.disk import DiskModel, SimDisk
from bkaio.testing.sim.meta import LostAnswer, MemoryMetadataServer, StoreFaults
from bkaio.testing.sim.process import SimProcess, outside
from bkaio.testing.sim.threads import ProcessCrashed, SimThreads

if TYPE_CHECKING:
    from bkaio.testing.sim.network import SimNetwork

INSTANCE_ID = "sim-cluster"
REGISTRATION_TTL_SECONDS = 2.0
RESTART_DELAY_SECONDS = 1.0
MAX_RESTARTS = 20  # A bookie that fails to start this often stays down (the final phase says so).


class JournalFailedExit(Exception):
    """A simulated bookie's journal failed: its process exits (the worker's exit 3)."""


@dataclass
class Environment:
    """What every simulated machine shares: the loop, the network, the metadata cluster."""

    loop: asyncio.AbstractEventLoop
    network: SimNetwork
    metadata: MemoryMetadataServer
    rng: random.Random
    metadata_latency: tuple[float, float] = (0.0005, 0.005)
    lost_metadata_answers: float = 0.0
    lost_metadata_kinds: tuple[LostAnswer, ...] = tuple(LostAnswer)
    notes: list[str] = field(default_factory=list)  # What happened, for the seed's report.

    def note(self, text: str) -> None:
        self.notes.append(f"t={self.loop.time():.3f} {text}")

    def metadata_connection(self) -> Metadata:
        faults = StoreFaults(
            random.Random(self.rng.random()),
            latency=self.metadata_latency,
            lost_answer=self.lost_metadata_answers,
            lost_kinds=self.lost_metadata_kinds,
            note=self.note,
        )
        return Metadata(self.metadata.connect(faults), INSTANCE_ID, id_block_size=10)


class SimCrashPoint:
    """A `CrashPoints` that ends the simulated process the `passes`-th time at `point`."""

    armed = True

    def __init__(self, point: str, passes: int, crash: Callable[[], None]) -> None:
        self.point = point
        self.passes = passes
        self._crash = crash
        self.reached_count = 0

    def disarm(self) -> None:
        self.point = ""

    def reached(self, name: str) -> None:
        if name != self.point:
            return
        self.reached_count += 1
        if self.reached_count == self.passes:
            self._crash()
            raise ProcessCrashed(f"crash point {name}")


class SimBookie(SimProcess):
    def __init__(
        self,
        env: Environment,
        index: int,
        root: Path,
        disk_model: DiskModel,
        *,
        journal_ack: JournalAckPolicy = ACK_AFTER_SYNC,
    ) -> None:
        super().__init__(f"b{index}", env.loop)
        self.env = env
        self.host = f"10.0.0.{index + 1}"
        self.port = 3181
        self.bookie_id = f"{self.host}:{self.port}"
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.disk = SimDisk(root, random.Random(env.rng.random()), disk_model)
        self.journal_ack = journal_ack
        self.crash_points: CrashPoints = NO_CRASH_POINTS
        self.config = _bookie_config(self.bookie_id, self.host, self.port, root)
        self.info = BookieInfo(bookie_id=self.bookie_id, host=self.host, port=self.port)
        self.server: ShardServer | None = None
        self.storage: ShardStorage | None = None
        self.serving = asyncio.Event()  # Of the current incarnation: listening ...
        self.registered = asyncio.Event()  # ... and registered.
        self.start_failures: list[str] = []
        self.starts = 0
        self._fatal: asyncio.Future[BKError] = env.loop.create_future()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.begin()
        self.starts += 1
        self.serving = asyncio.Event()
        self.registered = asyncio.Event()
        self._fatal = self.loop.create_future()
        self.spawn(self._main(), "main")

    async def _main(self) -> None:
        """The process's main: when it fails, the process exits and its service manager
        starts it again a little later (systemd's Restart=on-failure)."""
        try:
            await self._run()
        except Exception as error:
            # The machine's directory named by the machine: a report reads the same every run.
            self.env.note(f"{self.name} exited: {error!r}".replace(str(self.root), self.name))
            self.start_failures.append(repr(error))
            if len(self.start_failures) < MAX_RESTARTS:
                self.loop.call_later(
                    RESTART_DELAY_SECONDS, self._restart_after_failure, context=outside()
                )
            self.crash(power_loss=False)

    def _restart_after_failure(self) -> None:
        if not self.alive:
            self.start()

    def crash(self, *, power_loss: bool) -> None:
        """The process dies now (with the machine's power: unsynced writes are lost too)."""
        incarnation = self.kill()
        if incarnation is None:
            return
        self.disk.crash(power_loss=power_loss)
        self.env.network.process_died(self, incarnation)
        self.server = self.storage = None

    def disarm_crash_point(self) -> None:
        """The armed point (if any) fires no more, in this incarnation or a later one."""
        if isinstance(self.crash_points, SimCrashPoint):
            self.crash_points.disarm()
        self.crash_points = NO_CRASH_POINTS

    def arm_crash_point(self, point: str, passes: int, *, power_loss: bool) -> None:
        self.crash_points = SimCrashPoint(point, passes, lambda: self.crash(power_loss=power_loss))

    async def _run(self) -> None:
        env = self.env
        threads = SimThreads(env.loop, self._latency)
        metadata = env.metadata_connection()
        try:
            storage = await ShardStorage.open(
                self.config.storage[0],
                bookie_id=self.bookie_id,
                shard_index=0,
                shard_count=1,
                instance_id=INSTANCE_ID,
                journal_factory=lambda config, directory: self._open_journal(
                    config, directory, threads
                ),
                usage_function=self.disk.usage,
                entry_log_disk=self.disk,
                crash_points=self.crash_points,
                threads=threads,
            )
        except BaseException:
            with contextlib.suppress(BKError):
                await metadata.close()
            raise

        async def key_source() -> KeySource:
            return MetadataKeySource(metadata)

        server = ShardServer(
            self.config,
            0,
            storage,
            ShardMetrics(),
            key_verifier=LedgerKeyVerifier(key_source),
        )
        self.storage, self.server = storage, server
        storage.write_failure_listener = functools.partial(self._storage_failed, server)
        if storage.write_failure is not None:  # Failed before the listener was there.
            self._storage_failed(server, True)
        env.network.listen(self, self.host, self.port, lambda: BookieServerProtocol(server))
        self.serving.set()
        registration = await metadata.bookies.register(self.info, REGISTRATION_TTL_SECONDS)
        self.registered.set()
        await self._sweep(server, registration)

    async def _sweep(self, server: ShardServer, registration: BookieRegistration) -> None:
        """Sweep every second until the journal fails: then the process exits (`_main`
        restarts it later), its registration's lease left to expire."""
        del registration  # Kept alive by its own task; dies with the process.
        fatal = self._fatal
        while not fatal.done():
            await asyncio.wait([fatal], timeout=1.0)
            server.sweep(self.loop.time())
        raise JournalFailedExit(f"journal failed: {fatal.result()}")

    def _storage_failed(self, server: ShardServer, failed: bool) -> None:
        self.env.note(f"{self.name} {'read-only: storage failed' if failed else 'writable again'}")
        server.set_read_only(storage_failed=failed)

    def _journal_failed(self, error: BKError) -> None:
        if not self._fatal.done():
            self._fatal.set_result(error)

    async def _open_journal(
        self, config: JournalConfig, directory: Path, threads: SimThreads
    ) -> Journal:
        journal = await Journal.open(
            config,
            directory=directory,
            disk=self.disk,
            crash_points=self.crash_points,
            ack_policy=self.journal_ack,
            threads=threads,
        )
        journal.on_failure = self._journal_failed
        return journal

    def _latency(self, name: str) -> float:
        return self.disk.latency("read" if name.endswith("read") else "sync")


class SimClient(SimProcess):
    """An application process with one `BookKeeper`."""

    def __init__(
        self,
        env: Environment,
        name: str,
        address_book: dict[str, BookieInfo],
        *,
        recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS,
        add_timeout: float = 1.0,
        read_timeout: float = 1.0,
    ) -> None:
        super().__init__(name, env.loop)
        self.env = env
        self.address_book = address_book
        self.recovery_reads = recovery_reads
        self.config = ClientConfig(
            add_timeout=add_timeout,
            read_timeout=read_timeout,
            client_id=name,
            connect_timeout=1.0,
            explicit_lac_interval=0.05,
            reconnect_backoff_min=0.02,
            reconnect_backoff_max=0.5,
        )
        self.bookkeeper: BookKeeper | None = None

    def start(self) -> None:
        self.begin()

    async def connect(self) -> BookKeeper:
        """The client's `BookKeeper` (opened the first time); call from the client's tasks."""
        if self.bookkeeper is not None:
            return self.bookkeeper
        metadata = self.env.metadata_connection()
        pool = BookiePool(self.config, self.address_book.get)
        client = BookKeeper(
            ledgers=metadata.ledgers,
            ops=pool,
            config=self.config,
            metadata=metadata,
            rng=random.Random(self.env.rng.random()),
            recovery_reads=self.recovery_reads,
        )
        client.set_bookies(await metadata.bookies.list())
        self.spawn(self._watch_bookies(client, metadata), "bookie-watch")
        self.bookkeeper = client
        return client

    @staticmethod
    async def _watch_bookies(client: BookKeeper, metadata: Metadata) -> None:
        """What `BookKeeper.connect` runs: the registry's view, kept current."""
        with contextlib.suppress(BKError):
            async for bookies in metadata.bookies.watch():
                client.set_bookies(bookies)

    def crash(self) -> None:
        incarnation = self.kill()
        if incarnation is not None:
            self.env.network.process_died(self, incarnation)
        self.bookkeeper = None


@functools.lru_cache(maxsize=64)
def _bookie_config(bookie_id: str, host: str, port: int, root: Path) -> BookieConfig:
    """Built once per machine and directory (building one takes milliseconds: the runner's
    workers build theirs before they fork a process per seed)."""
    data: dict[str, Any] = {
        "bookie": {"bookie_id": bookie_id, "host": host, "port": port, "shards": 1},
        "metadata": {"uri": "etcd://sim:2379/bkaio", "registration_ttl_seconds": 2.0},
        "storage": {
            "journal_dirs": [str(root / "journal")],
            "ledger_dirs": [str(root / "ledgers")],
            "flush_interval_seconds": 0.2,
            "write_cache_bytes": 4 * 1024 * 1024,
            "index_map_bytes": 64 * 1024 * 1024,
            "entry_log_max_bytes": 256 * 1024,
        },
        "journal": {"max_file_bytes": 64 * 1024},
        "log": {"level": "critical", "json": True},
    }
    return build_bookie_config(data, env={})


def warm_up(root: Path, machines: int = 8) -> None:
    """Build the configurations of `machines` bookies under `root` ahead of the seeds."""
    for index in range(machines):
        host = f"10.0.0.{index + 1}"
        _bookie_config(f"{host}:3181", host, 3181, root / f"b{index}")
