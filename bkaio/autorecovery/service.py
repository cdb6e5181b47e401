"""`AutorecoveryService`: auditor election plus a replication worker, in one process.

A bookie runs one (unless `[autorecovery] enabled = false`); `run_autorecovery` runs one on its
own (`bkaio autorecovery`, `python -m bkaio.autorecovery`). Every service stands for auditor
(unless `auditor_enabled = false`); the elected one audits until its lease is lost or the
service stops, when it resigns so that another takes over at once.

Both long-lived tasks run under a `Supervisor` (bkaio/supervision.py, policy `Restart`): an
unexpected exception is logged at ERROR with the task's name, counted in
`bkaio_task_failures_total{task="replication_worker"|"auditor_election"}`, and the task is
restarted after a jittered backoff. They run in the supervisor of the process that hosts the
service (a bookie's parent, or `run_autorecovery`'s own), so that process's /metrics counts
them. Expected failures (a ledger that cannot be copied now, the metadata store unreachable)
are handled inside the tasks and never end them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from typing import Any

import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from bkaio.backoff import Backoff
from bkaio.config import AutorecoveryConfig
from bkaio.errors import BKError
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import Metadata, open_metadata
from bkaio.supervision import (
    EXIT_TASK_FAILED,
    Restart,
    Supervisor,
    bounded,
    loop_supervisor,
    unless_stopped,
)

from .auditor import Auditor
from .checker import LedgerChecker
from .cluster import ClusterView, MasterKeys
from .metrics import AutorecoveryMetrics
from .replicator import Replicator
from .worker import ReplicationWorker

log = structlog.get_logger(__name__)

_ELECTION_RETRY = (1.0, 30.0)  # Backoff of a failing election: initial, maximum seconds.


class AutorecoveryService:
    def __init__(
        self,
        metadata: Metadata,
        *,
        owner: str,
        config: AutorecoveryConfig | None = None,
        admin_token: str = "",
        metrics: AutorecoveryMetrics | None = None,
        tls: ssl.SSLContext | None = None,
        auth_token: str | None = None,
    ) -> None:
        self.metadata = metadata
        self.owner = owner
        self.config = config or AutorecoveryConfig()
        self.metrics = metrics or AutorecoveryMetrics()
        # Bookies that require TLS or a HELLO token require them of replicators too.
        client_config = ClientConfig(
            client_id="bkaio-autorecovery",
            add_timeout=15.0,
            read_timeout=15.0,
            auth_token=auth_token or None,
        )
        self.view = ClusterView(metadata, client_config=client_config, tls=tls)
        self.keys = MasterKeys(self.view, self.config.admin_token or admin_token, tls=tls)
        self.replicator = Replicator(
            self.view, self.keys, self.metrics, entries_in_flight=self.config.entries_in_flight
        )
        self.auditor: Auditor | None = None  # Set while this service is the elected auditor.
        self.worker: ReplicationWorker | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.view.start()
        # Both are loops that start over cleanly: a bug in either is reported and restarted
        # (bkaio/supervision.py), in the supervisor of the process running the service.
        supervisor = loop_supervisor()
        instance = f"{self.owner}#{id(self)}"
        if self.config.auditor_enabled:
            self._tasks.append(
                supervisor.spawn("auditor_election", self._elect, Restart(), instance=instance)
            )
        worker = ReplicationWorker(
            self.metadata,
            self.replicator,
            self.metrics,
            owner=self.owner,
            lease_ttl_seconds=self.config.worker_lease_ttl_seconds,
            concurrency=self.config.worker_concurrency,
            open_ledger_grace_seconds=self.config.open_ledger_grace_seconds,
            retry_backoff_seconds=self.config.retry_backoff_seconds,
            retry_backoff_max_seconds=self.config.retry_backoff_max_seconds,
            poll_interval_seconds=self.config.poll_interval_seconds,
        )
        self.worker = worker
        self._tasks.append(
            supervisor.spawn("replication_worker", worker.run, Restart(), instance=instance)
        )
        log.info("autorecovery_started", owner=self.owner, auditor=self.config.auditor_enabled)

    async def _elect(self) -> None:
        """Stand for auditor; audit while elected; stand again when the lease is lost."""
        config = self.config
        retry = Backoff(*_ELECTION_RETRY)
        while True:
            try:
                leadership = await self.metadata.auditor.run_for_auditor(
                    self.owner, config.auditor_lease_ttl_seconds
                )
            except BKError as error:
                delay = retry.next_delay()
                log.warning("auditor_election_failed", error=str(error), retry_in=round(delay, 2))
                await asyncio.sleep(delay)
                continue
            retry.reset()
            self.metrics.is_auditor.set(1)
            auditor = Auditor(
                self.metadata,
                self.metrics,
                lease=leadership.lease,
                lost_bookie_delay_seconds=config.lost_bookie_delay_seconds,
                audit_interval_seconds=config.audit_interval_seconds,
                checker=LedgerChecker(self.view, self.metrics),
                ledger_check_interval_seconds=config.ledger_check_interval_seconds,
            )
            self.auditor = auditor
            loop = asyncio.get_running_loop()
            audit = loop.create_task(auditor.run(), name="auditor")
            lost = loop.create_task(leadership.wait_lost())
            try:
                await asyncio.wait([audit, lost], return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.auditor = None
                self.metrics.is_auditor.set(0)
                for task in (audit, lost):
                    task.cancel()
                await asyncio.gather(audit, lost, return_exceptions=True)
                with contextlib.suppress(BKError):
                    await leadership.resign()  # Let the next candidate in at once.
            if audit.done() and not audit.cancelled() and audit.exception() is not None:
                raise audit.exception()  # type: ignore[misc]  # A bug: for the supervisor.
            log.warning("auditor_leadership_ended", owner=self.owner)

    async def close(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.keys.close()
        await self.view.close()
        log.info("autorecovery_stopped", owner=self.owner)


def default_owner() -> str:
    return f"autorecovery-{socket.gethostname()}-{os.getpid()}"


async def run_autorecovery(
    metadata_uri: str,
    *,
    config: AutorecoveryConfig | None = None,
    admin_token: str = "",
    owner: str | None = None,
    stop: asyncio.Event | None = None,
    metrics_registry: CollectorRegistry | None = None,
    tls: ssl.SSLContext | None = None,
    auth_token: str | None = None,
) -> int:
    """Run an auditor candidate and a replication worker until `stop` is set (or cancelled).

    `admin_token` is the bookies' admin token (needed to learn ledgers' master keys); `tls`
    and `auth_token` what the bookies require of clients (TLS also for HTTPS admin APIs). Returns
    the process exit code: 0 when stopped, `EXIT_TASK_FAILED` when a task failed for good.
    Stops within a few seconds of `stop` whatever the metadata store is doing.
    """
    stop = stop if stop is not None else asyncio.Event()
    registry = metrics_registry or REGISTRY
    supervisor = Supervisor("autorecovery", registry=registry)
    supervisor.adopt_loop()
    supervisor.install_loop_exception_handler()
    try:
        # Bad under-replication records are counted there too, beside the service's metrics.
        opening = asyncio.ensure_future(open_metadata(metadata_uri, metrics_registry=registry))
        if not await unless_stopped(opening, stop):
            return 0
        metadata = opening.result()
        service = AutorecoveryService(
            metadata,
            owner=owner or default_owner(),
            config=config,
            admin_token=admin_token,
            metrics=AutorecoveryMetrics(metrics_registry),
            tls=tls,
            auth_token=auth_token,
        )
        try:
            if await unless_stopped(asyncio.ensure_future(service.start()), stop):
                stop_wait = asyncio.ensure_future(stop.wait())
                fatal: asyncio.Future[Any] = supervisor.fatal
                try:
                    await asyncio.wait([stop_wait, fatal], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop_wait.cancel()
        finally:
            await bounded(service.close(), "stop_autorecovery")  # Resigns as auditor.
            await bounded(metadata.close(), "close_metadata")
    finally:
        await supervisor.stop()
    return EXIT_TASK_FAILED if supervisor.fatal.done() else 0
