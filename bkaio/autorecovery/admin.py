"""Operator controls of autorecovery, as plain functions: what `bkaio shell autorecovery |
lostbookierecoverydelay | triggeraudit | listunderreplicated | whoisauditor | recommission` and
the bookies' /api/v1/autorecovery/... endpoints call.

    await autorecovery_status(uri) -> AutorecoveryStatus
    await set_autorecovery_enabled(uri, False); await is_autorecovery_enabled(uri)
    await get_lost_bookie_delay(uri, default) -> LostBookieDelay
    await set_lost_bookie_delay(uri, 600.0)           # None: back to each auditor's config
    await trigger_audit(uri)                          # the elected auditor audits now
    await list_under_replicated(uri, bad=[]) -> list[UnderreplicatedLedger]  # bad: undecodable
    await who_is_auditor(uri) -> str | None
    await list_decommissioned(uri); await recommission_bookie(uri, "10.0.0.7:3181")

Every function takes a metadata URI or an open `bkaio.meta.Metadata`. The long operations
(`recover_bookie`, `decommission_bookie`) are in drain.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import structlog

from bkaio.errors import BKError
from bkaio.meta import (
    BadUnderreplicationRecord,
    Decommissioned,
    Metadata,
    UnderreplicatedLedger,
    open_metadata,
)
from bkaio.meta.ledger_metadata import now_ms

log = structlog.get_logger(__name__)


class UnknownBookieError(BKError):
    """The bookie id is not registered, has no cookie, and no ledger names it."""


@dataclass(frozen=True, slots=True)
class LostBookieDelay:
    seconds: float  # What auditors apply now.
    from_metadata: bool  # An operator set it cluster-wide; else it is `default` (the config's).

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "source": "metadata" if self.from_metadata else "config"}


@dataclass(frozen=True, slots=True)
class AutorecoveryStatus:
    enabled: bool
    auditor: str | None
    lost_bookie_delay_seconds: float | None  # None: not set in metadata (each config's).
    under_replicated_ledgers: int
    decommissioned_bookies: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "auditor": self.auditor,
            "lost_bookie_delay_seconds": self.lost_bookie_delay_seconds,
            "under_replicated_ledgers": self.under_replicated_ledgers,
            "decommissioned_bookies": list(self.decommissioned_bookies),
        }


@contextlib.asynccontextmanager
async def metadata_of(target: str | Metadata) -> AsyncIterator[Metadata]:
    """`target` itself when it is open metadata; else a connection for the block."""
    if isinstance(target, Metadata):
        yield target
        return
    metadata = await open_metadata(target)
    try:
        yield metadata
    finally:
        await metadata.close()


async def who_is_auditor(metadata: str | Metadata) -> str | None:
    """The owner id of the elected auditor, None when there is none."""
    async with metadata_of(metadata) as meta:
        return await meta.auditor.who_is_auditor()


async def list_under_replicated(
    metadata: str | Metadata, *, bad: list[BadUnderreplicationRecord] | None = None
) -> list[UnderreplicatedLedger]:
    """Every ledger marked under-replicated, with the bookies it misses, by ledger id. Records
    that do not decode are left out (logged; appended to `bad` when given)."""
    async with metadata_of(metadata) as meta:
        return [record async for record in meta.underreplication.list(bad=bad)]


def mark_age_seconds(record: UnderreplicatedLedger, at_ms: int | None = None) -> float:
    """How long ago the ledger was first marked."""
    return max(0, (now_ms() if at_ms is None else at_ms) - record.ctime_ms) / 1000


async def set_autorecovery_enabled(metadata: str | Metadata, enabled: bool) -> None:
    """The cluster-wide switch: auditor and workers idle while it is off."""
    async with metadata_of(metadata) as meta:
        await meta.underreplication.set_enabled(enabled)
        log.info("autorecovery_switched", enabled=enabled)


async def is_autorecovery_enabled(metadata: str | Metadata) -> bool:
    async with metadata_of(metadata) as meta:
        return await meta.underreplication.is_enabled()


async def autorecovery_status(metadata: str | Metadata) -> AutorecoveryStatus:
    """The switch, the auditor, the delay set in metadata, and how much work is queued."""
    async with metadata_of(metadata) as meta:
        ur = meta.underreplication
        marked = sum([1 async for _ in ur.list()])
        decommissioned = tuple(sorted(item.bookie_id for item in await meta.decommissioned.list()))
        return AutorecoveryStatus(
            await ur.is_enabled(),
            await meta.auditor.who_is_auditor(),
            await ur.lost_bookie_delay(),
            marked,
            decommissioned,
        )


async def get_lost_bookie_delay(metadata: str | Metadata, default: float) -> LostBookieDelay:
    """The lost-bookie delay auditors apply: the metadata's when set, else `default`."""
    async with metadata_of(metadata) as meta:
        stored = await meta.underreplication.lost_bookie_delay()
    return LostBookieDelay(default if stored is None else stored, stored is not None)


async def set_lost_bookie_delay(metadata: str | Metadata, seconds: float | None) -> None:
    """Set the delay for every auditor (None: each applies its config again). The elected
    auditor re-plans at once. InvalidArgumentError outside [0, a week]."""
    async with metadata_of(metadata) as meta:
        await meta.underreplication.set_lost_bookie_delay(seconds)
    log.info("lost_bookie_delay_set", seconds=seconds)


async def trigger_audit(metadata: str | Metadata) -> str | None:
    """Ask the elected auditor to audit now, marking the ledgers of every lost bookie without
    waiting out the delay. Returns the auditor asked (None: none is elected now; the next
    one audits when elected anyway)."""
    async with metadata_of(metadata) as meta:
        await meta.underreplication.request_audit()
        return await meta.auditor.who_is_auditor()


async def list_decommissioned(metadata: str | Metadata) -> list[Decommissioned]:
    async with metadata_of(metadata) as meta:
        return await meta.decommissioned.list()


async def recommission_bookie(metadata: str | Metadata, bookie_id: str) -> bool:
    """Let a decommissioned bookie be writable again (it follows the record and turns
    writable when nothing else keeps it read-only). False if it was not decommissioned."""
    async with metadata_of(metadata) as meta:
        removed = await meta.decommissioned.remove(bookie_id)
    log.info("bookie_recommissioned", bookie_id=bookie_id, was_decommissioned=removed)
    return removed


async def check_known_bookie(meta: Metadata, bookie_id: str, named: bool) -> bool:
    """Whether `bookie_id` is registered now; UnknownBookieError when nothing knows it
    (`named`: some ledger's metadata names it)."""
    registered = await meta.bookies.ids()
    if bookie_id in registered:
        return True
    if named:
        return False
    try:
        known = (
            await meta.cookies.get(bookie_id) is not None
            or await meta.decommissioned.get(bookie_id) is not None
        )
    except BKError:  # Not even a well-formed id.
        known = False
    if not known:
        raise UnknownBookieError(
            f"bookie {bookie_id!r} is unknown: not registered, no cookie in metadata and no "
            "ledger names it (is the id host:port as `bkaio shell listbookies` shows it?)"
        )
    return False
