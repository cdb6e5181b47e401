"""The recovery work the bookie parent runs in-process: autorecovery, and limbo after a reformat.

`RecoveryServices` is the part of `BookieParent` (a mixin over `ParentState`, parent_state.py)
that starts and stops the autorecovery service when `autorecovery.enabled` (bkaio/autorecovery:
auditor election and replication), puts the ledgers that name this bookie into limbo when its
disks were reformatted (a new cookie instance about to be published, limbo.py), and copies them
back out of limbo from their other replicas under the supervisor. bkaio.autorecovery and the
ledger client are imported only where they are used.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bkaio.errors import BKError
from bkaio.security.tls import bookie_client_tls_context
from bkaio.supervision import Restart

from .limbo import enter_limbo
from .parent_state import ParentState


class RecoveryServices(ParentState):
    """Autorecovery and limbo repair of `BookieParent` (a mixin: the parent's state, these
    methods)."""

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

    async def _stop_autorecovery(self) -> None:
        service, self.autorecovery = self.autorecovery, None
        if service is not None:
            try:
                await service.close()
            except BKError as error:
                self.log.warning("autorecovery_stop_failed", error=str(error))

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
        tls = bookie_client_tls_context(self.config.tls)
        view = ClusterView(self.metadata, client_config=client_config, tls=tls)
        await view.start()
        keys = MasterKeys(
            view, self.config.autorecovery.admin_token or self.config.admin.token, tls=tls
        )
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
