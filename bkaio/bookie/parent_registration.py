"""The bookie's registration in metadata, its mode and its health, as the bookie parent keeps them.

`RegistrationAndHealth` is the part of `BookieParent` (a mixin over `ParentState`,
parent_state.py) that says whether the bookie is read-only (a shard says so, or an operator:
`set_forced_read_only` from the admin API, the config's `start_read_only`, or
/decommissioned/<id> in metadata, which it watches), tells the shards what the operator decided,
and moves the registration between /bookies and /bookies/readonly as the mode changes (retried
with backoff until it is done). `mark_unhealthy` is how a failure the bookie cannot recover from
is reported: `/health` 503, systemd STATUS=, the registration removed (clients change ensembles
away from the bookie), then a stop (exit 3). `registration_state` is what the admin state and the
registration gauges show of the registration.
"""

from __future__ import annotations

import asyncio

from bkaio.backoff import Backoff
from bkaio.errors import BKError
from bkaio.meta.bookies import RegistrationState
from bkaio.supervision import Once

from .parent_state import ParentState


class RegistrationAndHealth(ParentState):
    """Mode, health and registration of `BookieParent` (a mixin: the parent's state, these
    methods)."""

    @property
    def read_only(self) -> bool:
        return self.read_only_by_operator or any(w.read_only for w in self.workers)

    @property
    def read_only_by_operator(self) -> bool:
        return self.forced_read_only or self.decommissioned

    @property
    def registration_state(self) -> str:
        """A `RegistrationState` value ("registered", "unconfirmed" while its lease is in doubt,
        "lost", "deregistered"), or "none" before the bookie registered and once it let its
        registration go."""
        registration = self.registration
        if registration is None:
            return "none"
        state: RegistrationState = registration.state
        return state.value

    @property
    def healthy(self) -> bool:
        return self.unhealthy_reason is None and self.supervisor.healthy

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
