"""What the bookie parent answers its admin HTTP: state, info, metrics, ledger keys, GC.

`AdminView` is the part of `BookieParent` (a mixin over `ParentState`, parent_state.py) that
answers most of `AdminHost` (admin_http.py; `set_forced_read_only` is in parent_registration.py):
the bookie's state (admin `/status`), its info with every shard's, the shards' metrics merged
with the parent's own at scrape time, a ledger's master key from its shard, and each shard's GC
record or a GC run now.
"""

from __future__ import annotations

import asyncio
from typing import Any

import prometheus_client

import bkaio
from bkaio.errors import BKError
from bkaio.meta import Metadata
from bkaio.meta.bookies import RegistrationState
from bkaio.metric_snapshots import BkaioOnly, snapshot_registry

from .parent_state import ParentState

GC_REPLY_TIMEOUT_SECONDS = 300.0  # A GC run may compact large entry logs.
_NO_SPACE = {"total_bytes": None, "free_bytes": None, "filesystems": 0}  # No shard answered.


class AdminView(ParentState):
    """The admin answers of `BookieParent` (a mixin: the parent's state, these methods)."""

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
            # "registered", "unconfirmed" (its lease in doubt: the store may have dropped it),
            # "lost" (out of the registry until the registration is back), "deregistered" or
            # "none" (not yet registered, or let go). is_ready answers 503 unless it is
            # registered or unconfirmed.
            "registration": self.registration_state,
            # True only while the store confirmed the lease within its TTL.
            "registered": self.registration_state == RegistrationState.REGISTERED.value,
            "shards_read_only": [w.read_only for w in self.workers],
            "journal_sync": self.journal_sync,
            "limbo": self.limbo.summary(),
            "tasks": [t.as_dict() for t in self.supervisor.statuses()],
        }

    @property
    def admin_metadata(self) -> Metadata | None:
        return self.metadata  # type: ignore[no-any-return]

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
