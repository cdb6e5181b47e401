"""The state of the bookie parent, shared by the modules `BookieParent` is made of.

`BookieParent` (parent.py: construction, start, run, stop, `run_bookie`) is assembled from one
part per responsibility, each a mixin over `ParentState`: the shard worker processes
(parent_workers.py), the registration and the bookie's mode and health (parent_registration.py),
the recovery work it runs in-process, autorecovery and limbo (parent_recovery.py), and what the
admin HTTP asks it (parent_admin.py). `ParentState` names the attributes they share (set by
`BookieParent.__init__`) and the members one part uses from another.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from bkaio.config import BookieConfig
from bkaio.supervision import Supervisor, unless_stopped

from .admin_jobs import AdminJobs
from .limbo import LimboMetrics
from .metrics import AggregatingCollector
from .sdnotify import SystemdNotifier
from .worker_handle import WorkerHandle


class ParentState:
    """What the parts of `BookieParent` share (set by `BookieParent.__init__`)."""

    config: BookieConfig
    worker_command: tuple[str, ...]
    log: structlog.typing.FilteringBoundLogger
    workers: list[WorkerHandle]
    notifier: SystemdNotifier
    forced_read_only: bool
    decommissioned: bool  # /decommissioned/<id> exists in metadata: read-only until it goes.
    shutting_down: bool
    running: bool
    registration: Any  # The bookie's registration in metadata while it holds one.
    metadata: Any  # The metadata connection, once open.
    admin_url: str
    metrics_registry: CollectorRegistry
    journal_sync: bool
    autorecovery: Any  # AutorecoveryService while it runs.
    jobs: AdminJobs
    limbo: LimboMetrics
    supervisor: Supervisor
    unhealthy_reason: str | None  # Set once: the bookie then stops.
    _aggregate: AggregatingCollector
    _own_registry: CollectorRegistry
    _mode_changed: asyncio.Event  # The registration may need to move.
    _stop: asyncio.Event
    _limbo_repair: asyncio.Task[None] | None

    @property
    def read_only(self) -> bool:
        raise NotImplementedError

    @property
    def healthy(self) -> bool:
        raise NotImplementedError

    @property
    def registration_state(self) -> str:
        raise NotImplementedError

    def mark_unhealthy(self, reason: str) -> None:
        raise NotImplementedError

    async def _until_stop_or(self, future: asyncio.Future[Any]) -> bool:
        """Wait for `future`; False (and `future` cancelled) if a stop signal comes first."""
        return await unless_stopped(future, self._stop)
