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

This module holds `BookieParent`'s construction and life cycle (start, run, stop) and
`run_bookie`; the rest of it is one part per responsibility, each a mixin over `ParentState`
(parent_state.py): the worker processes (parent_workers.py, with worker_handle.py), the
registration, mode and health (parent_registration.py), autorecovery and limbo
(parent_recovery.py), and the admin answers (parent_admin.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import uvloop
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

import bkaio
from bkaio.config import BookieConfig, load_bookie_config
from bkaio.errors import BKError
from bkaio.fault_switches import fault_switch_refusal
from bkaio.logs import configure_logging
from bkaio.meta.bookies import RegistrationState
from bkaio.process_metrics import ProcessesCollector
from bkaio.security.tls import server_tls_context
from bkaio.supervision import EXIT_TASK_FAILED, FatalTaskFailure, Restart, Supervisor, bounded

from .admin import build_admin_app
from .admin_jobs import AdminJobs
from .limbo import LimboMetrics, load_limbo
from .metrics import AggregatingCollector
from .parent_admin import AdminView
from .parent_recovery import RecoveryServices
from .parent_registration import RegistrationAndHealth
from .parent_workers import WORKER_COMMAND, ShardWorkers, disable_grpc_fork_handlers
from .sdnotify import SystemdNotifier
from .worker_handle import WorkerHandle

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_WORKER_DIED = 1
EXIT_START_FAILED = 2
ADMIN_SHUTDOWN_SECONDS = 2.0  # Stopping waits this long for admin requests in progress.


class BookieParent(ShardWorkers, RegistrationAndHealth, RecoveryServices, AdminView):
    """A bookie's parent process (module docstring); its parts are mixins over `ParentState`."""

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
        registered = RegistrationState.REGISTERED.value
        Gauge(
            "bkaio_bookie_registered",
            "1 while the bookie holds its registration in metadata under a lease the store "
            "confirmed within its TTL; 0 while that lease is in doubt, lost, or not yet granted",
            registry=self.metrics_registry,
        ).set_function(lambda: 1.0 if self.registration_state == registered else 0.0)
        unconfirmed = RegistrationState.UNCONFIRMED.value
        Gauge(
            "bkaio_bookie_registration_unconfirmed",
            "1 while the registration's lease is in doubt: no refresh confirmed within its TTL "
            "(a stalled event loop, a slow or unreachable store) and the store not asked again yet",
            registry=self.metrics_registry,
        ).set_function(lambda: 1.0 if self.registration_state == unconfirmed else 0.0)
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
                check_cookies(
                    self.config,
                    self.metadata.cookies,
                    self._enter_limbo_if_known,
                    cluster_instance_id=self.metadata.instance_id,
                )
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
            # Unhealthy while the other shards drain (/health, systemd STATUS=), not healthy.
            self.mark_unhealthy(
                ", ".join(
                    f"shard {w.shard_index} worker died (exit {w.process.returncode})" for w in dead
                )
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

    async def _start_admin(self) -> web.AppRunner | None:
        admin = self.config.admin
        if not admin.enabled:
            return None
        runner = web.AppRunner(
            build_admin_app(self), access_log=None, shutdown_timeout=ADMIN_SHUTDOWN_SECONDS
        )
        # HTTPS with the bookie's certificate (admin.tls; docs/security.md). Server
        # authentication only: the admin token guards what changes or reveals secrets, and
        # Prometheus scrapes /metrics with the cluster CA alone.
        ssl_context = None
        if self.config.admin_https:
            tls = self.config.tls
            ssl_context = await asyncio.to_thread(
                server_tls_context, tls.cert_file, tls.key_file, min_version=tls.min_version
            )
        await runner.setup()
        site = web.TCPSite(runner, admin.host, admin.port, ssl_context=ssl_context)
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
        self.admin_url = self.config.admin_url(port)
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
    disable_grpc_fork_handlers()

    async def main() -> int:
        return await BookieParent(config, worker_command=worker_command).run()

    return uvloop.run(main())
