"""The bookie parent process: shard workers, registration, admin HTTP, systemd notifications.

    run_bookie(config_path) -> exit code      (`bkaio bookie --config` and `python -m bkaio.bookie`)

Workers are started with `WORKER_COMMAND` (`python -m bkaio.bookie.worker`); the test entry
point `python -m bkaio.testing.bookie` runs this same parent with its own worker command, which
passes the parts it injects on to the workers. A retired fault switch (bkaio/fault_switches.py)
in the environment stops the start with exit 2.

Start: load the configuration, check the cookies against metadata, spawn one worker process per
shard (bkaio/bookie/worker.py), wait until every shard listens, serve admin HTTP, register the
bookie (lease + keep-alive), send READY=1 and keep the watchdog fed. While running it mirrors
the shards' read-only state into the registration. SIGTERM/SIGINT: STOPPING=1, deregister, stop
the workers (they finish in-flight requests and close storage), exit 0. A worker that dies
unexpectedly stops the others and the parent exits 1; a failed start exits 2. A task that failed
for good, in a worker (its `fatal` event, e.g. a journal that cannot sync) or here, makes the
bookie unhealthy at once (`/health` 503, systemd STATUS=, registration removed so that clients
change ensembles); it then stops like on SIGTERM and exits 3 (`EXIT_TASK_FAILED`).

`journal.sync = false` (BookKeeper's journalSyncData=false: acknowledged entries can be lost on
a power failure) is loud: a WARNING at start, `journal_sync` in the state (admin `/status`,
`/api/v1/bookie/state` and `info`) and in the registration (`bkaio shell listbookies`), and the
`bkaio_journal_sync_enabled` gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final

import prometheus_client
import structlog
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

import bkaio
from bkaio.backoff import Backoff
from bkaio.config import BookieConfig, load_bookie_config
from bkaio.errors import BKError
from bkaio.fault_switches import fault_switch_refusal
from bkaio.logs import configure_logging
from bkaio.meta import Metadata
from bkaio.process_metrics import ProcessesCollector
from bkaio.security.tls import bookie_client_tls_context
from bkaio.supervision import (
    EXIT_TASK_FAILED,
    Fatal,
    FatalTaskFailure,
    Once,
    Restart,
    Supervisor,
    bounded,
    unless_stopped,
)

from .admin import build_admin_app
from .admin_jobs import AdminJobs
from .control import decode_message, encode_message
from .limbo import LimboMetrics, enter_limbo, load_limbo
from .metrics import AggregatingCollector, BkaioOnly, snapshot_registry
from .sdnotify import SystemdNotifier

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_WORKER_DIED = 1
EXIT_START_FAILED = 2
WORKER_START_TIMEOUT_SECONDS = 120.0  # Journal replay of a large journal can take a while.
CONTROL_REPLY_TIMEOUT_SECONDS = 5.0
GC_REPLY_TIMEOUT_SECONDS = 300.0  # A GC run may compact large entry logs.
_NO_SPACE = {"total_bytes": None, "free_bytes": None, "filesystems": 0}  # No shard answered.
# How a shard worker is started; `--config`, `--shard` and `--instance-id` follow.
WORKER_COMMAND: Final = (sys.executable, "-m", "bkaio.bookie.worker")
ADMIN_SHUTDOWN_SECONDS = 2.0  # Stopping waits this long for admin requests in progress.


class WorkerHandle:
    """The parent's view of one shard worker process and its control channel."""

    def __init__(self, shard_index: int, process: asyncio.subprocess.Process) -> None:
        self.shard_index = shard_index
        self.process = process
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.read_only = False
        self.stopping = False
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self.on_read_only: Any = None
        self.on_fatal: Any = None  # Called with (task, error) when the worker reports one.
        self.reader: asyncio.Task[None] | None = None  # `read_events`, under the supervisor.

    async def read_events(self) -> None:
        """Until the worker's control channel closes (run as a supervised task)."""
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            line = await stdout.readline()
            if not line:
                break
            try:
                message = decode_message(line)
            except BKError as error:
                log.warning("worker_control_garbage", shard=self.shard_index, error=str(error))
                continue
            self._on_message(message)
        if not self.ready.done():
            self.ready.set_exception(
                BKError(f"shard {self.shard_index} worker exited before it was ready")
            )
        for waiter in self._replies.values():
            if not waiter.done():
                waiter.set_exception(BKError(f"shard {self.shard_index} worker is gone"))

    def _on_message(self, message: dict[str, Any]) -> None:
        event = message.get("event")
        if "reply" in message:
            waiter = self._replies.pop(int(message["reply"]), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(message.get("result") or {})
        elif event == "ready":
            self.read_only = bool(message.get("read_only"))
            if not self.ready.done():
                self.ready.set_result(message)
        elif event == "failed":
            if not self.ready.done():
                self.ready.set_exception(
                    BKError(f"shard {self.shard_index}: {message.get('error', 'failed')}")
                )
        elif event == "read_only":
            self.read_only = bool(message.get("read_only"))
            if self.on_read_only is not None:
                self.on_read_only()
        elif event == "fatal" and self.on_fatal is not None:
            self.on_fatal(str(message.get("task", "?")), str(message.get("error", "")))

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.write(encode_message(message))

    async def call(
        self, method: str, *, reply_seconds: float = CONTROL_REPLY_TIMEOUT_SECONDS, **fields: Any
    ) -> dict[str, Any]:
        self._next_id += 1
        request_id = self._next_id
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = waiter
        try:
            self.send({"id": request_id, "method": method, **fields})
            async with asyncio.timeout(reply_seconds):
                return await waiter
        finally:
            self._replies.pop(request_id, None)


class BookieParent:
    def __init__(
        self, config: BookieConfig, *, worker_command: Sequence[str] = WORKER_COMMAND
    ) -> None:
        assert config.source is not None, "workers load the configuration from its file"
        self.config = config
        self.worker_command = tuple(worker_command)
        self.log = log.bind(bookie_id=config.bookie_id)
        self.workers: list[WorkerHandle] = []
        self.notifier = SystemdNotifier()
        self.forced_read_only = config.read_only.start_read_only
        # An operator decommissioned this bookie (/decommissioned/<id> in metadata): read-only
        # until recommissioned, whatever the config or the admin API say.
        self.decommissioned = False
        self.shutting_down = False
        self.running = False
        self.registration: Any = None
        self.metadata: Any = None
        self.admin_url = ""
        self.metrics_registry = CollectorRegistry(auto_describe=True)
        self._aggregate = AggregatingCollector()
        self.metrics_registry.register(self._aggregate)
        self.metrics_registry.register(ProcessesCollector(self._process_ids))
        self._registered_gauge = Gauge(
            "bkaio_bookie_registered",
            "1 while the bookie holds its registration in metadata",
            registry=self.metrics_registry,
        )
        self._registered_gauge.set_function(lambda: 1.0 if self.registration is not None else 0.0)
        # Every shard's journal is built from the one [journal] section: one answer per bookie.
        self.journal_sync = all(storage.journal.sync for storage in config.storage)
        Gauge(
            "bkaio_journal_sync_enabled",
            "1 when the journal fsyncs each group before acknowledging it; 0 with "
            "journal.sync = false, when a power failure can lose acknowledged entries",
            registry=self.metrics_registry,
        ).set(1.0 if self.journal_sync else 0.0)
        self._mode_changed = asyncio.Event()  # The registration may need to move.
        self._stop = asyncio.Event()
        self.autorecovery: Any = None  # AutorecoveryService while it runs.
        self.jobs = AdminJobs()
        self.limbo = LimboMetrics(self.metrics_registry)
        self._limbo_repair: asyncio.Task[None] | None = None
        # Its own failures counter, merged with the shards' at scrape time (`refresh_metrics`).
        self._own_registry = CollectorRegistry(auto_describe=True)
        self.supervisor = Supervisor("bookie", registry=self._own_registry)
        self.unhealthy_reason: str | None = None  # Set once: the bookie then stops.

    def _process_ids(self) -> list[tuple[str, int]]:
        """This bookie's processes for process_* metrics: the parent and each live worker."""
        processes = [("parent", os.getpid())]
        for worker in self.workers:
            if worker.process.returncode is None:
                processes.append((f"shard-{worker.shard_index}", worker.process.pid))
        return processes

    # --- state for admin ---------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        return self.read_only_by_operator or any(w.read_only for w in self.workers)

    @property
    def read_only_by_operator(self) -> bool:
        return self.forced_read_only or self.decommissioned

    @property
    def healthy(self) -> bool:
        return self.unhealthy_reason is None and self.supervisor.healthy

    def state(self) -> dict[str, Any]:
        return {
            "bookie_id": self.config.bookie_id,
            "running": self.running,
            "healthy": self.healthy,
            "unhealthy_reason": self.unhealthy_reason,
            "read_only": self.read_only,
            "forced_read_only": self.forced_read_only,
            "decommissioned": self.decommissioned,
            "shutting_down": self.shutting_down,
            "registered": self.registration is not None,
            "shards_read_only": [w.read_only for w in self.workers],
            "journal_sync": self.journal_sync,
            "limbo": self.limbo.summary(),
            "tasks": [t.as_dict() for t in self.supervisor.statuses()],
        }

    @property
    def admin_metadata(self) -> Metadata | None:
        return self.metadata  # type: ignore[no-any-return]

    def trigger_local_audit(self) -> bool:
        """Audit now if this bookie is the elected auditor; whether it is."""
        service = self.autorecovery
        auditor = None if service is None else service.auditor
        if auditor is not None:
            auditor.trigger()
        return auditor is not None

    async def info(self) -> dict[str, Any]:
        shards = await asyncio.gather(
            *(w.call("info") for w in self.workers), return_exceptions=True
        )
        shard_infos: list[dict[str, Any]] = [
            s if isinstance(s, dict) else {"error": str(s)} for s in shards
        ]
        # Every shard measures the bookie's space (space.py) with its disk checks: take the
        # first answer, so that GET_BOOKIE_INFO and this report the same figure.
        space = next((s["space"] for s in shard_infos if "space" in s), _NO_SPACE)
        return {
            **self.state(),
            "version": bkaio.__version__,
            "host": self.config.advertised_host,
            "port": self.config.port,
            "shard_count": self.config.shard_count,
            "rack": self.config.rack,
            "admin_url": self.admin_url,
            **space,
            "freeSpace": space["free_bytes"],  # BookKeeper's names (GET /api/v1/bookie/info).
            "totalSpace": space["total_bytes"],
            "shards": shard_infos,
        }

    async def refresh_metrics(self) -> None:
        replies = await asyncio.gather(
            *(w.call("metrics") for w in self.workers), return_exceptions=True
        )
        for worker, reply in zip(self.workers, replies, strict=True):
            if isinstance(reply, dict) and "families" in reply:
                self._aggregate.snapshots[worker.shard_index] = reply["families"]
        # Its own tasks' failures, and those of library jobs (autorecovery's client, counted
        # in the default registry).
        self._aggregate.snapshots[-1] = snapshot_registry(
            [self._own_registry, BkaioOnly(prometheus_client.REGISTRY)]
        )

    async def set_forced_read_only(self, value: bool) -> None:
        self.forced_read_only = value
        await self._apply_operator_mode()

    async def _apply_operator_mode(self) -> None:
        """Tell the shards whether an operator holds the bookie read-only, then the registry."""
        value = self.read_only_by_operator
        await asyncio.gather(
            *(w.call("set_forced_read_only", value=value) for w in self.workers),
            return_exceptions=True,
        )
        await self._sync_registration_mode()

    async def _follow_decommission(self) -> None:
        """Follow /decommissioned/<this bookie>: read-only while it exists."""
        retry = Backoff(0.5, 30.0)
        while True:
            try:
                async for decommissioned in self.metadata.decommissioned.watch(
                    self.config.bookie_id
                ):
                    retry.reset()
                    if decommissioned != self.decommissioned:
                        self.decommissioned = decommissioned
                        self.log.warning(
                            "bookie_decommission_changed", decommissioned=decommissioned
                        )
                        await self._apply_operator_mode()
            except BKError as error:
                self.log.warning("decommission_watch_failed", error=str(error))
            await asyncio.sleep(retry.next_delay())

    async def _sync_registration_mode(self) -> None:
        """Ask the registration keeper to match the bookie's mode now."""
        self._mode_changed.set()

    async def _keep_registration_mode(self) -> None:
        """Move the registration to /bookies/readonly and back as the shards' mode changes.

        A move that fails (metadata unreachable) is retried with backoff until it is done: a
        read-only bookie that stayed registered as writable would keep getting new ledgers.
        """
        backoff = Backoff(0.2, 5.0)
        while True:
            await self._mode_changed.wait()
            self._mode_changed.clear()
            registration = self.registration
            if registration is None:
                continue
            try:
                await registration.set_read_only(self.read_only)
            except BKError as error:
                delay = backoff.next_delay()
                self.log.warning(
                    "registration_mode_change_failed", error=str(error), retry_in=round(delay, 2)
                )
                self._mode_changed.set()
                await asyncio.sleep(delay)
            else:
                backoff.reset()

    async def ledger_key(self, ledger_id: int) -> str | None:
        """Hex master key the shard of `ledger_id` recorded; None if it has none."""
        worker = self.workers[ledger_id % len(self.workers)]
        reply = await worker.call("ledger_key", ledger_id=ledger_id)
        if "error" in reply:
            raise BKError(f"shard {worker.shard_index}: {reply['error']}")
        key = reply.get("master_key")
        return None if key is None else str(key)

    async def gc_details(self) -> list[dict[str, Any]]:
        """Each shard's garbage collection and compaction record (GET .../gc_details)."""
        replies = await asyncio.gather(
            *(w.call("gc_details") for w in self.workers), return_exceptions=True
        )
        return [r if isinstance(r, dict) else {"error": str(r)} for r in replies]

    async def run_gc(self) -> list[dict[str, Any]]:
        """One garbage collection run on every shard, now."""
        replies = await asyncio.gather(
            *(w.call("gc", reply_seconds=GC_REPLY_TIMEOUT_SECONDS) for w in self.workers),
            return_exceptions=True,
        )
        return [r if isinstance(r, dict) else {"error": str(r)} for r in replies]

    async def _start_autorecovery(self) -> None:
        if not self.config.autorecovery.enabled:
            return
        from bkaio.autorecovery import AutorecoveryMetrics, AutorecoveryService

        if not (self.config.autorecovery.admin_token or self.config.admin.token):
            self.log.warning(
                "autorecovery_without_admin_token",
                hint="set admin.token (the same on every bookie): replication needs it to"
                " learn ledgers' master keys from other bookies",
            )
        service = AutorecoveryService(
            self.metadata,
            owner=self.config.bookie_id,
            config=self.config.autorecovery,
            admin_token=self.config.admin.token,
            metrics=AutorecoveryMetrics(self.metrics_registry),
            tls=bookie_client_tls_context(self.config.tls),
            auth_token=self.config.server.auth_token,
        )
        await service.start()
        self.autorecovery = service

    async def _enter_limbo_if_known(self, cookies: list[Any]) -> None:
        """A new cookie instance is about to be published: if ledgers already name this
        bookie id, its disks were reformatted; put those ledgers into limbo (persisted per
        shard) before it serves anything (bkaio/bookie/limbo.py)."""
        from bkaio.autorecovery.auditor import ledgers_naming

        named = [md.ledger_id for md in await ledgers_naming(self.metadata, self.config.bookie_id)]
        if not named:
            return
        reason = (
            f"new cookie instance {cookies[0].instance_id} for {self.config.bookie_id}, "
            f"which {len(named)} ledgers name: its disks were reformatted"
        )
        loop = asyncio.get_running_loop()
        counts = await loop.run_in_executor(None, enter_limbo, self.config, named, reason)
        self.log.warning(
            "bookie_reformatted_entering_limbo", ledgers=len(named), per_shard=counts, reason=reason
        )

    def _start_limbo_repair(self) -> None:
        if not self.limbo.ledgers:
            return
        # Ends when every ledger is repaired; a bug is reported and restarted.
        self._limbo_repair = self.supervisor.spawn(
            "limbo_repair", self._repair_limbo, Restart(1.0, 60.0)
        )

    async def _repair_limbo(self) -> None:
        """Copy every ledger in limbo back from its other replicas, then clear it."""
        from bkaio.autorecovery.cluster import ClusterView, MasterKeys
        from bkaio.autorecovery.limbo_repair import LimboRepair
        from bkaio.ledger_client.types import ClientConfig

        client_config = ClientConfig(
            client_id=f"bkaio-limbo-{self.config.bookie_id}",
            add_timeout=15.0,
            read_timeout=15.0,
            auth_token=self.config.server.auth_token or None,
        )
        view = ClusterView(
            self.metadata,
            client_config=client_config,
            tls=bookie_client_tls_context(self.config.tls),
        )
        await view.start()
        keys = MasterKeys(view, self.config.autorecovery.admin_token or self.config.admin.token)
        try:
            repair = LimboRepair(
                self.config.bookie_id,
                view,
                keys,
                self._clear_limbo,
                self.limbo,
                entries_in_flight=self.config.autorecovery.entries_in_flight,
            )
            await repair.run(set(self.limbo.ledgers))
        finally:
            await keys.close()
            await view.close()
        self.log.warning("bookie_left_limbo", **self.limbo.summary())

    async def _clear_limbo(self, ledger_id: int) -> None:
        worker = self.workers[ledger_id % len(self.workers)]
        reply = await worker.call("limbo_clear", ledger_id=ledger_id)
        if "error" in reply:
            raise BKError(f"shard {worker.shard_index}: {reply['error']}")

    async def _stop_autorecovery(self) -> None:
        service, self.autorecovery = self.autorecovery, None
        if service is not None:
            try:
                await service.close()
            except BKError as error:
                self.log.warning("autorecovery_stop_failed", error=str(error))

    def _on_worker_read_only(self) -> None:
        self._mode_changed.set()

    def _on_worker_fatal(self, shard_index: int, task: str, error: str) -> None:
        self.mark_unhealthy(f"shard {shard_index}: {task}: {error}")

    def mark_unhealthy(self, reason: str) -> None:
        """A failure the bookie cannot recover from: say so everywhere, leave the registration
        (clients change ensembles away from us), then stop (exit 3)."""
        if self.unhealthy_reason is not None:
            return
        self.unhealthy_reason = reason
        self.log.error("bookie_unhealthy", reason=reason)
        self.notifier.notify(f"STATUS=unhealthy: {reason[:200]}")
        self.supervisor.spawn("deregister", self._deregister, Once())
        self._stop.set()

    async def _deregister(self) -> None:
        registration, self.registration = self.registration, None
        if registration is not None:
            try:
                await registration.deregister()
            except BKError as error:  # The lease then ends by itself, within its TTL.
                self.log.warning("deregister_failed", error=str(error))

    # --- life cycle --------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        self.supervisor.adopt_loop()
        self.supervisor.install_loop_exception_handler()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop.set)
        from bkaio.meta import BookieInfo, open_metadata

        from .cookies import check_cookies

        runner: web.AppRunner | None = None
        if not self.journal_sync:
            self.log.warning(
                "journal_sync_disabled",
                hint="journal.sync = false: entries are acknowledged before they reach the disk;"
                " a power failure or kernel crash can lose acknowledged entries",
            )
        try:
            # Every step that waits on metadata gives way to a stop signal: an unreachable
            # etcd is retried for `retry_seconds`, and SIGTERM must not wait for that.
            opening = asyncio.ensure_future(open_metadata(self.config.metadata.uri))
            if not await self._until_stop_or(opening):
                return await self._shutdown(EXIT_OK)
            self.metadata = opening.result()
            checking = asyncio.ensure_future(
                check_cookies(self.config, self.metadata.cookies, self._enter_limbo_if_known)
            )
            if not await self._until_stop_or(checking):
                return await self._shutdown(EXIT_OK)
            cookies = checking.result()
            self.limbo.load(await loop.run_in_executor(None, load_limbo, self.config))
            decommission = asyncio.ensure_future(
                self.metadata.decommissioned.get(self.config.bookie_id)
            )
            if not await self._until_stop_or(decommission):
                return await self._shutdown(EXIT_OK)
            self.decommissioned = decommission.result() is not None
            await self._spawn_workers([c.instance_id for c in cookies])
            if not await self._wait_ready():
                return EXIT_START_FAILED
            if self.decommissioned:
                self.log.warning("bookie_decommissioned_stays_read_only")
                await self._apply_operator_mode()
            self.supervisor.spawn("decommission_watch", self._follow_decommission, Restart())
            runner = await self._start_admin()
            self.running = True
            info = BookieInfo(
                bookie_id=self.config.bookie_id,
                host=self.config.advertised_host,
                port=self.config.port,
                shard_count=self.config.shard_count,
                rack=self.config.rack,
                version=bkaio.__version__,
                admin_url=self.admin_url,
                read_only=self.read_only,
                journal_sync=self.journal_sync,
            )
            registration_wait = asyncio.ensure_future(
                self.metadata.bookies.register(info, self.config.metadata.registration_ttl_seconds)
            )
            if not await self._until_stop_or(registration_wait):
                return await self._shutdown(EXIT_OK)
            self.registration = registration_wait.result()
            self.supervisor.spawn("registration_mode", self._keep_registration_mode, Restart())
            self._mode_changed.set()  # A shard may have flipped meanwhile.
            if not await self._until_stop_or(asyncio.ensure_future(self._start_autorecovery())):
                return await self._shutdown(EXIT_OK)
            self._start_limbo_repair()
            self.notifier.notify("READY=1", f"STATUS=serving {self.config.shard_count} shards")
            self.log.info(
                "bookie_started",
                shards=self.config.shard_count,
                port=self.config.port,
                admin_url=self.admin_url,
                read_only=self.read_only,
            )
            self.supervisor.spawn("systemd_watchdog", self.notifier.run_watchdog, Restart())
            exits = [loop.create_task(w.process.wait()) for w in self.workers]
            stop_wait = loop.create_task(self._stop.wait())
            fatal: asyncio.Future[Any] = self.supervisor.fatal
            done, _ = await asyncio.wait(
                [stop_wait, fatal, *exits], return_when=asyncio.FIRST_COMPLETED
            )
            stop_wait.cancel()
            for wait in exits:
                wait.cancel()
            if fatal.done():
                failure: FatalTaskFailure = fatal.result()
                self.mark_unhealthy(str(failure))
            if self.unhealthy_reason is not None:
                return await self._shutdown(EXIT_TASK_FAILED)
            if stop_wait in done:
                return await self._shutdown(EXIT_OK)
            dead = [w for w in self.workers if w.process.returncode is not None]
            for worker in dead:
                self.log.error(
                    "shard_worker_died",
                    shard=worker.shard_index,
                    returncode=worker.process.returncode,
                )
            return await self._shutdown(EXIT_WORKER_DIED)
        except BKError as error:
            self.log.error("bookie_start_failed", error=str(error))
            print(f"bkaio bookie: {error}", file=sys.stderr)
            return await self._shutdown(EXIT_START_FAILED)
        finally:
            await self.supervisor.stop()
            if runner is not None:
                await runner.cleanup()
            if self.metadata is not None:
                with contextlib.suppress(BKError):
                    await self.metadata.close()

    async def _until_stop_or(self, future: asyncio.Future[Any]) -> bool:
        """Wait for `future`; False (and `future` cancelled) if a stop signal comes first."""
        return await unless_stopped(future, self._stop)

    async def _spawn_workers(self, instance_ids: list[str]) -> None:
        assert self.config.source is not None
        for shard_index in range(self.config.shard_count):
            process = await asyncio.create_subprocess_exec(
                *self.worker_command,
                "--config",
                str(self.config.source),
                "--shard",
                str(shard_index),
                "--instance-id",
                instance_ids[shard_index],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            worker = WorkerHandle(shard_index, process)
            worker.on_read_only = self._on_worker_read_only
            worker.on_fatal = partial(self._on_worker_fatal, shard_index)
            # Without its control channel the parent can neither stop nor ask the worker.
            worker.reader = self.supervisor.spawn(
                "worker_control", worker.read_events, Fatal(), instance=str(shard_index)
            )
            self.workers.append(worker)

    async def _wait_ready(self) -> bool:
        readies = asyncio.gather(*(w.ready for w in self.workers))
        try:
            async with asyncio.timeout(WORKER_START_TIMEOUT_SECONDS):
                started = await self._until_stop_or(readies)
        except (BKError, TimeoutError) as error:
            self.log.error("shard_start_failed", error=str(error) or "timed out")
            await self._stop_workers()
            return False
        if not started:
            await self._stop_workers()
            return False
        return True

    async def _start_admin(self) -> web.AppRunner | None:
        admin = self.config.admin
        if not admin.enabled:
            return None
        runner = web.AppRunner(
            build_admin_app(self), access_log=None, shutdown_timeout=ADMIN_SHUTDOWN_SECONDS
        )
        await runner.setup()
        site = web.TCPSite(runner, admin.host, admin.port)
        try:
            await site.start()
        except OSError as error:
            await runner.cleanup()
            raise BKError(
                f"admin HTTP cannot listen on {admin.host}:{admin.port}: {error}"
            ) from error
        server = site._server  # aiohttp keeps the listening sockets here.
        sockets = getattr(server, "sockets", None) or ()
        port = sockets[0].getsockname()[1] if sockets else admin.port
        self.admin_url = f"http://{admin.host}:{port}"
        return runner

    async def _shutdown(self, exit_code: int) -> int:
        self.shutting_down = True
        self.notifier.notify("STOPPING=1")
        self.log.info("bookie_stopping", exit_code=exit_code)
        # Metadata may be unreachable: these give up after a bound (the lease and the auditor
        # lease then end by themselves, within their TTL).
        await bounded(self._stop_autorecovery(), "stop_autorecovery")  # Resigns as auditor.
        limbo_repair, self._limbo_repair = self._limbo_repair, None
        if limbo_repair is not None:  # Before the shards it copies into stop.
            limbo_repair.cancel()
            await asyncio.gather(limbo_repair, return_exceptions=True)
        await self.jobs.cancel_all()
        await bounded(self._deregister(), "deregister")
        codes = await self._stop_workers()
        if exit_code == EXIT_OK and any(code not in (0, None) for code in codes):
            self.log.error("shard_worker_stopped_badly", returncodes=codes)
            exit_code = EXIT_WORKER_DIED
        self.running = False
        self.log.info("bookie_stopped", exit_code=exit_code)
        return exit_code

    async def _stop_workers(self) -> list[int | None]:
        for worker in self.workers:
            if worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGTERM)
        grace = self.config.server.drain_timeout_seconds + 10.0
        codes: list[int | None] = []
        for worker in self.workers:
            try:
                async with asyncio.timeout(grace):
                    codes.append(await worker.process.wait())
            except TimeoutError:
                self.log.error("shard_worker_kill", shard=worker.shard_index)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                codes.append(await worker.process.wait())
            if worker.reader is not None:
                worker.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker.reader
        return codes


def run_bookie(config_path: Path, *, worker_command: Sequence[str] = WORKER_COMMAND) -> int:
    """Run a bookie until SIGTERM/SIGINT; exit code 0 clean, 1 a worker died, 2 start failed."""
    refusal = fault_switch_refusal()
    if refusal is not None:
        print(f"bkaio bookie: {refusal}", file=sys.stderr)
        return EXIT_START_FAILED
    try:
        config = load_bookie_config(config_path)
    except BKError as error:
        print(f"bkaio bookie: {error}", file=sys.stderr)
        return EXIT_START_FAILED
    configure_logging(json=config.log.json, level=config.log.level, cache=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")

    async def main() -> int:
        return await BookieParent(config, worker_command=worker_command).run()

    return uvloop.run(main())
