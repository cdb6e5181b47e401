"""A shard worker process: one uvloop event loop serving one shard of a bookie.

    python -m bkaio.bookie.worker --config bookie.toml --shard 0 [--instance-id ID]

Opens the shard's `ShardStorage` (cookies checked, journal replayed), listens on port + shard,
serves requests (bkaio/bookie/server.py), checks disk usage periodically, and talks to the parent
over the control channel (bkaio/bookie/control.py). SIGTERM/SIGINT or EOF from the parent: stop
accepting, finish in-flight requests, close storage (which syncs), exit 0. Exit 2: it could not
start (bad config, cookie mismatch, port in use, a retired fault switch in its environment). Exit 3
(`EXIT_TASK_FAILED`): a task it cannot do without failed for good (bkaio/supervision.py); the
parent is told first (`fatal` event).

Its storage is built with `PRODUCTION_SEAMS` (bkaio/bookie/seams.py); the test entry point
`python -m bkaio.testing.bookie.worker` runs this same worker with injected parts.

Every background loop (sweep, disk check, loop-lag watch, GC, storage's flush) runs under the
shard's `Supervisor`: a failure is logged at ERROR with the task's name, counted in
`bkaio_task_failures_total{task}`, and the loop restarts after a backoff.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import prometheus_client
import structlog
import uvloop

from bkaio.config import BookieConfig, load_bookie_config
from bkaio.errors import BKError
from bkaio.fault_switches import fault_switch_refusal
from bkaio.journal import Journal, JournalConfig, JournalStats
from bkaio.logs import configure_logging
from bkaio.metric_snapshots import BkaioOnly, snapshot_registry
from bkaio.runtime_tuning import tune_gc_for_throughput
from bkaio.security.ledger_keys import KeySource, LedgerKeyVerifier, MetadataKeySource
from bkaio.security.tls import server_tls_context_from_config
from bkaio.supervision import EXIT_TASK_FAILED, FatalTaskFailure, Once, Restart, Supervisor

from .connection import BookieServerProtocol
from .control import decode_message, encode_message
from .gc import GarbageCollector, GcReport, MetadataGcSource
from .limbo import LimboLedgers, limbo_path
from .loop_lag import watch_loop_lag
from .metrics import JournalStatsCollector, ShardMetrics
from .offline import entry_digest_ok
from .scrubber import Scrubber, ScrubMetrics
from .seams import PRODUCTION_SEAMS, StorageSeams
from .server import ShardServer
from .space import ledger_directories, measure_space

log = structlog.get_logger(__name__)

EXIT_START_FAILED = 2


class _ControlReader(asyncio.Protocol):
    """Lines from the parent (stdin); EOF means the parent is gone."""

    def __init__(self, on_message: Any, on_eof: Any) -> None:
        self._buffer = bytearray()
        self._on_message = on_message
        self._on_eof = on_eof

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if line.strip():
                self._on_message(decode_message(line))

    def eof_received(self) -> bool | None:
        self._on_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_eof()


class ShardWorker:
    def __init__(
        self,
        config: BookieConfig,
        shard_index: int,
        instance_id: str,
        seams: StorageSeams = PRODUCTION_SEAMS,
    ) -> None:
        self.config = config
        self.shard_index = shard_index
        self.instance_id = instance_id
        self.seams = seams
        self.log = log.bind(bookie_id=config.bookie_id, shard=shard_index)
        self.stop_requested = asyncio.Event()
        self.metrics = ShardMetrics()
        self._journals: list[Journal] = []
        self._control: asyncio.WriteTransport | None = None
        self.server: ShardServer | None = None
        self._gc: GarbageCollector | None = None
        self._gc_lock = asyncio.Lock()
        self._gc_metadata: Any = None
        self._control_calls = 0  # Names the control requests run as tasks.
        self.supervisor: Supervisor | None = None
        self._storage: Any = None  # The shard's ShardStorage once open.
        self.scrubber: Scrubber | None = None
        self._gc_status = GcStatus()

    def send(self, message: dict[str, Any]) -> None:
        if self._control is not None and not self._control.is_closing():
            self._control.write(encode_message(message))

    async def _open_journal(self, journal_config: JournalConfig, directory: Path) -> Journal:
        journal = await Journal.open(
            journal_config,
            directory=directory,
            disk=self.seams.disk,
            crash_points=self.seams.crash_points,
            ack_policy=self.seams.journal_ack,
            threads=self.seams.threads,
        )
        journal.on_failure = self._journal_failed
        self._journals.append(journal)
        return journal

    def _journal_failed(self, error: BKError) -> None:
        """A journal write or sync failed: it has stopped acknowledging (every add waiting on
        it, and every later one, fails), and nothing here can make it durable again. Fatal:
        the parent marks the bookie unhealthy and deregisters it, and the process exits 3 so
        that systemd restarts it (BookKeeper stops a bookie whose journal fails too)."""
        if self.supervisor is not None:
            self.supervisor.report_fatal("journal", error)

    def _journal_stats(self) -> list[JournalStats]:
        return [journal.metrics for journal in self._journals]

    async def run(self, control_fd: int) -> int:
        from bkaio.entrylog.shard_storage import ShardStorage

        loop = asyncio.get_running_loop()
        supervisor = Supervisor(f"shard-{self.shard_index}", registry=self.metrics.registry)
        self.supervisor = supervisor
        supervisor.adopt_loop()
        supervisor.install_loop_exception_handler()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop_requested.set)
        self._control, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(control_fd, "wb", buffering=0)
        )
        await loop.connect_read_pipe(
            lambda: _ControlReader(self._on_control, self.stop_requested.set), sys.stdin
        )
        self.metrics.registry.register(JournalStatsCollector(self._journal_stats))
        config = self.config
        try:
            storage = await ShardStorage.open(
                config.storage[self.shard_index],
                bookie_id=config.bookie_id,
                shard_index=self.shard_index,
                shard_count=config.shard_count,
                instance_id=self.instance_id,
                journal_factory=self._open_journal,
                usage_function=self.seams.disk.usage,
                entry_log_disk=self.seams.disk,
                crash_points=self.seams.crash_points,
                threads=self.seams.threads,
            )
        except BKError as error:
            self.log.error("shard_storage_open_failed", error=str(error))
            self.send({"event": "failed", "error": str(error)})
            return EXIT_START_FAILED
        try:
            ssl_context = server_tls_context_from_config(config.tls)
        except BKError as error:
            self.log.error("tls_setup_failed", error=str(error))
            self.send({"event": "failed", "error": str(error)})
            await storage.close()
            return EXIT_START_FAILED
        try:
            limbo = await loop.run_in_executor(
                None, LimboLedgers.load, limbo_path(config, self.shard_index)
            )
        except BKError as error:
            self.log.error("limbo_load_failed", error=str(error))
            self.send({"event": "failed", "error": str(error)})
            await storage.close()
            return EXIT_START_FAILED
        if limbo.ids:
            self.log.warning("shard_in_limbo", ledgers=len(limbo.ids), reason=limbo.reason)
        key_verifier = None
        if config.server.ledger_key_check == "metadata":
            key_verifier = LedgerKeyVerifier(
                self._open_key_source, cache_entries=config.server.ledger_key_cache_entries
            )
        server = ShardServer(
            config,
            self.shard_index,
            storage,
            self.metrics,
            on_read_only_change=lambda ro: self.send({"event": "read_only", "read_only": ro}),
            key_verifier=key_verifier,
            limbo=limbo,
        )
        self.server = server
        self._storage = storage
        storage.write_failure_listener = lambda failed: server.set_read_only(storage_failed=failed)
        if storage.write_failure is not None:  # Failed before the listener was there.
            server.set_read_only(storage_failed=True)
        await self._check_disks()
        port = config.shard_port(self.shard_index)
        try:
            listener = await loop.create_server(
                lambda: BookieServerProtocol(server),
                config.host,
                port,
                reuse_address=True,
                backlog=1024,
                ssl=ssl_context,
                # A handshake that never completes is a slow-loris too.
                ssl_handshake_timeout=(
                    config.server.hello_timeout_seconds if ssl_context is not None else None
                ),
            )
        except OSError as error:
            self.log.error("listen_failed", host=config.host, port=port, error=str(error))
            self.send({"event": "failed", "error": f"cannot listen on {port}: {error}"})
            await storage.close()
            return EXIT_START_FAILED
        self.log.info(
            "shard_listening",
            port=port,
            ledgers=len(storage.ledger_ids()),
            read_only=server.read_only,
            cookie_instance_id=storage.cookie.instance_id,
        )
        self.send(
            {
                "event": "ready",
                "port": port,
                "read_only": server.read_only,
                "instance_id": storage.cookie.instance_id,
            }
        )
        tune_gc_for_throughput()  # Start-up objects frozen; young collections rarer.
        supervisor.spawn("sweep", partial(self._sweep_loop, server), Restart())
        supervisor.spawn("disk_check", self._disk_loop, Restart())
        supervisor.spawn(
            "loop_lag_watch",
            partial(watch_loop_lag, self.metrics.event_loop_lag.observe, self.log),
            Restart(),
        )
        if config.gc.enabled:
            supervisor.spawn("gc", self._gc_loop, Restart())
        if config.scrub.period_seconds > 0:
            self.scrubber = Scrubber(
                storage,
                config.scrub,
                ScrubMetrics(self.metrics.registry),
                digest_ok=entry_digest_ok,
            )
            supervisor.spawn("scrubber", self.scrubber.run_forever, Restart())
        exit_code = await self._until_stop_or_fatal(supervisor)
        self.log.info("shard_stopping", connections=len(server.connections))
        listener.close()
        await server.drain(config.server.drain_timeout_seconds)
        await supervisor.stop()
        if self._gc_metadata is not None:
            with contextlib.suppress(BKError):
                await self._gc_metadata.close()
        if key_verifier is not None:
            with contextlib.suppress(BKError):
                await key_verifier.close()
        await storage.close()
        self.log.info("shard_stopped", exit_code=exit_code)
        self.send({"event": "stopped"})
        return exit_code

    async def _until_stop_or_fatal(self, supervisor: Supervisor) -> int:
        """Wait for a stop request (exit 0) or a fatal task failure (exit 3, parent told)."""
        stop: asyncio.Future[Any] = asyncio.ensure_future(self.stop_requested.wait())
        fatal: asyncio.Future[Any] = supervisor.fatal
        try:
            await asyncio.wait([stop, fatal], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if not supervisor.fatal.done():
            return 0
        failure: FatalTaskFailure = supervisor.fatal.result()
        self.send({"event": "fatal", "task": failure.task, "error": str(failure)})
        return EXIT_TASK_FAILED

    async def _open_key_source(self) -> KeySource:
        """Metadata for first-sight key checks, opened on the first new ledger (read-only use)."""
        from bkaio.meta import open_metadata

        return MetadataKeySource(await open_metadata(self.config.metadata.uri))

    async def _sweep_loop(self, server: ShardServer) -> None:
        limits = self.config.server
        shortest = min(
            limits.hello_timeout_seconds,
            limits.frame_read_timeout_seconds,
            limits.idle_timeout_seconds,
        )
        interval = min(1.0, shortest / 4)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            server.sweep(loop.time())

    async def _check_disks(self) -> None:
        server = self.server
        assert server is not None
        loop = asyncio.get_running_loop()
        try:
            usages = await loop.run_in_executor(None, server.measure_disk_usage)
            server.space = await loop.run_in_executor(
                None, measure_space, ledger_directories(self.config), self.seams.disk.usage
            )
        except OSError as error:
            self.log.warning("disk_check_failed", error=str(error))
            return
        server.apply_disk_usage(usages)

    async def _disk_loop(self) -> None:
        interval = self.config.read_only.disk_check_interval_seconds
        while True:
            await asyncio.sleep(interval)
            await self._check_disks()

    async def _gc_collector(self, storage: Any) -> GarbageCollector:
        if self._gc is None:
            from bkaio.meta import open_metadata

            self._gc_metadata = await open_metadata(self.config.metadata.uri)
            gc = self.config.gc
            self._gc = GarbageCollector(
                storage,
                MetadataGcSource(self._gc_metadata, owner=f"gc:{self.config.bookie_id}"),
                bookie_id=self.config.bookie_id,
                grace_seconds=gc.grace_seconds,
                collect_overreplicated=gc.collect_overreplicated,
                overreplicated_grace_seconds=gc.overreplicated_grace_seconds,
                compact_after_delete=gc.compact_after_delete,
                compaction_interval_seconds=gc.compaction_interval_seconds,
            )
        return self._gc

    async def run_gc(self) -> dict[str, Any]:
        """One garbage collection run of this shard (periodic, or asked by the parent)."""
        server = self.server
        assert server is not None
        status = self._gc_status
        async with self._gc_lock:
            collector = await self._gc_collector(server.storage)
            status.running = True
            try:
                report = await collector.run_once()
            finally:
                status.running = False
        status.record(report)
        return {
            "shard_index": self.shard_index,
            "local_ledgers": report.local_ledgers,
            "deleted": list(report.deleted),
            "overreplicated": list(report.overreplicated),
            "candidates": report.candidates,
            "bytes_freed": report.compaction.bytes_freed if report.compaction else 0,
        }

    async def _gc_loop(self) -> None:
        interval = self.config.gc.interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run_gc()
            except BKError as error:  # Metadata unreachable, say: the next run tries again.
                self.log.warning("gc_failed", error=str(error))

    def _run_control_call(self, name: str, request_id: Any, work: Any) -> None:
        """Run a control request as a task; its answer (or error) goes back to the parent."""
        assert self.supervisor is not None
        self._control_calls += 1
        self.supervisor.spawn(
            name,
            partial(self._reply_later, request_id, work),
            Once(),
            instance=str(self._control_calls),
        )

    async def _reply_later(self, request_id: Any, work: Callable[[], Awaitable[Any]]) -> None:
        try:
            result = await work()
        except BKError as error:
            result = {"error": str(error)}
        except Exception as error:  # Answered, then reported by the supervisor.
            if request_id is not None:
                self.send({"reply": request_id, "result": {"error": repr(error)}})
            raise
        if request_id is not None:
            self.send({"reply": request_id, "result": result})

    def _on_control(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        request_id = message.get("id")
        server = self.server
        if method == "stop":
            self.stop_requested.set()
            return
        result: dict[str, Any]
        if server is None:
            result = {"error": "shard not started"}
        elif method == "metrics":
            registries: list[Any] = [self.metrics.registry, BkaioOnly(prometheus_client.REGISTRY)]
            result = {"families": snapshot_registry(registries)}
        elif method == "info":
            self._run_control_call("control_info", request_id, partial(self._info, server))
            return
        elif method == "set_forced_read_only":
            server.set_read_only(forced=bool(message.get("value")))
            self._run_control_call("control_info", request_id, partial(self._info, server))
            return
        elif method == "gc":
            self._run_control_call("control_gc", request_id, self.run_gc)
            return
        elif method == "limbo_clear" and server.limbo is not None:
            limbo = server.limbo

            async def clear() -> dict[str, Any]:
                cleared = await limbo.clear(int(message.get("ledger_id", -1)))
                return {"cleared": cleared, "limbo": limbo.summary()}

            self._run_control_call("control_limbo_clear", request_id, clear)
            return
        elif method == "gc_details":
            result = {"shard_index": self.shard_index, **self._gc_status.to_dict()}
        elif method == "ledger_key":
            state = server.storage.ledger_state(int(message.get("ledger_id", -1)))
            key = None if state is None or not state.master_key else state.master_key.hex()
            result = {"master_key": key}
        elif method == "check_disks":
            self._run_control_call("control_check_disks", None, self._check_disks)
            result = {}
        else:
            result = {"error": f"unknown method {method!r}"}
        if request_id is not None:
            self.send({"reply": request_id, "result": result})

    @property
    def storage_write_failure(self) -> str | None:
        """Why the shard's flushes fail (it is read-only meanwhile), None while they work."""
        return None if self._storage is None else self._storage.write_failure

    async def _info(self, server: ShardServer) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        usages = await loop.run_in_executor(None, server.storage.disk_usage)  # statvfs.
        supervisor = self.supervisor
        return {
            "healthy": supervisor is not None and supervisor.healthy,
            "tasks": [] if supervisor is None else [t.as_dict() for t in supervisor.statuses()],
            "shard_index": self.shard_index,
            "port": self.config.shard_port(self.shard_index),
            "read_only": server.read_only,
            "forced_read_only": server.forced_read_only,
            "disk_full": server.disk_full,
            "storage_write_failure": self.storage_write_failure,
            "connections": len(server.connections),
            "inflight_requests": server.inflight_requests,
            "limbo": server.limbo.summary() if server.limbo is not None else None,
            "space": server.space.to_dict(),  # The bookie's (space.py), as of the disk check.
            "scrub": {"enabled": False} if self.scrubber is None else self.scrubber.to_dict(),
            "disks": [
                {
                    "path": str(u.path),
                    "kind": u.kind,
                    "total_bytes": u.total_bytes,
                    "used_bytes": u.used_bytes,
                    "fraction": round(u.fraction, 6),
                }
                for u in usages
            ],
        }


class GcStatus:
    """What GET /api/v1/bookie/gc_details reports of one shard (BookKeeper's field names too;
    bkaio has one kind of compaction, reported as "major")."""

    def __init__(self) -> None:
        self.running = False
        self.runs = 0
        self.last_run_ms = 0
        self.compactions = 0
        self.last_compaction_ms = 0
        self.last_deleted = 0
        self.last_bytes_freed = 0

    def record(self, report: GcReport) -> None:
        now_ms = int(time.time() * 1000)
        self.runs += 1
        self.last_run_ms = now_ms
        self.last_deleted = len(report.deleted) + len(report.overreplicated)
        if report.compaction is not None:
            self.compactions += 1
            self.last_compaction_ms = now_ms
            self.last_bytes_freed = report.compaction.bytes_freed

    def to_dict(self) -> dict[str, Any]:
        return {
            "gc_running": self.running,
            "gc_runs": self.runs,
            "last_gc_ms": self.last_run_ms,
            "last_gc_ledgers_deleted": self.last_deleted,
            "compactions": self.compactions,
            "last_compaction_ms": self.last_compaction_ms,
            "last_compaction_bytes_freed": self.last_bytes_freed,
            "forceCompacting": self.running,
            "majorCompacting": self.running,
            "minorCompacting": False,
            "lastMajorCompactionTime": self.last_compaction_ms,
            "lastMinorCompactionTime": 0,
            "majorCompactionCounter": self.compactions,
            "minorCompactionCounter": 0,
        }


def main(
    argv: list[str] | None = None,
    *,
    seams: StorageSeams = PRODUCTION_SEAMS,
    prog: str = "python -m bkaio.bookie.worker",
) -> int:
    """Run one shard worker; `seams` are production's unless the test entry point passes its."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--shard", type=int, required=True)
    parser.add_argument("--instance-id", default="")
    args = parser.parse_args(argv)
    refusal = fault_switch_refusal()
    if refusal is not None:
        print(f"bookie shard {args.shard}: {refusal}", file=sys.stderr)
        return EXIT_START_FAILED
    # The control channel gets a private copy of stdout; fd 1 now goes to stderr, so a stray
    # print cannot corrupt it.
    control_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        config = load_bookie_config(args.config)
    except BKError as error:
        print(f"bookie shard {args.shard}: {error}", file=sys.stderr)
        return EXIT_START_FAILED
    configure_logging(json=config.log.json, level=config.log.level, cache=True)
    if not 0 <= args.shard < config.shard_count:
        log.error("bad_shard_index", shard=args.shard, shard_count=config.shard_count)
        return EXIT_START_FAILED
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    worker = ShardWorker(config, args.shard, args.instance_id, seams)
    with contextlib.suppress(KeyboardInterrupt):
        return uvloop.run(worker.run(control_fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
