"""Bookies an operator decommissioned (`bkaio shell decommission`): they register
read-only whatever their disks say, and the auditor counts them as lost, until recommissioned.

Layout:
    /decommissioned/<bookie id>    msgpack {ctime_ms}: stays read-only until removed
Driver-independent.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgpack

from bkaio.errors import InvalidArgumentError, MetadataVersionError
from bkaio.meta.errors import InvalidMetadataError, MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import now_ms
from bkaio.meta.store import (
    MAX_METADATA_ATTEMPTS,
    EventKind,
    KeyValue,
    MetadataStore,
    metadata_attempts_exhausted,
)

DECOMMISSIONED_PREFIX = "/decommissioned/"


@dataclass(frozen=True, slots=True)
class Decommissioned:
    bookie_id: str
    ctime_ms: int


class DecommissionRegistry:
    """Bookies an operator decommissioned: they register read-only, whatever their disks say,
    until `recommission` removes them; the auditor counts them as lost."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    @staticmethod
    def key(bookie_id: str) -> str:
        if not bookie_id or "/" in bookie_id:
            raise InvalidArgumentError(f"bookie id {bookie_id!r} must be non-empty, no '/'")
        return DECOMMISSIONED_PREFIX + bookie_id

    async def add(self, bookie_id: str) -> Decommissioned:
        """Idempotent: a bookie decommissioned twice keeps its first time. At most
        MAX_METADATA_ATTEMPTS creations, then MetadataError (not decommissioned)."""
        key = self.key(bookie_id)
        for _attempt in range(MAX_METADATA_ATTEMPTS):
            kv = await self._store.get(key)
            if kv is not None:
                return self._decode(kv)
            ctime = now_ms()
            try:
                await self._store.compare_and_swap(
                    key, msgpack.packb({"ctime_ms": ctime}), expected_version=0
                )
            except (MetadataVersionError, MetadataOutcomeUnknownError):
                continue  # Created meanwhile (maybe by us): the next read returns it.
            return Decommissioned(bookie_id, ctime)
        raise metadata_attempts_exhausted(f"bookie {bookie_id}", "decommissioning it")

    async def remove(self, bookie_id: str) -> bool:
        """False when the bookie was not decommissioned."""
        return await self._store.delete(self.key(bookie_id))

    async def get(self, bookie_id: str) -> Decommissioned | None:
        kv = await self._store.get(self.key(bookie_id))
        return None if kv is None else self._decode(kv)

    async def list(self) -> list[Decommissioned]:
        return [self._decode(kv) async for kv in self._store.iterate_prefix(DECOMMISSIONED_PREFIX)]

    async def ids(self) -> set[str]:
        return {item.bookie_id for item in await self.list()}

    async def watch(self, bookie_id: str) -> AsyncIterator[bool]:
        """Whether `bookie_id` is decommissioned now, then again after every change."""
        key = self.key(bookie_id)
        revision = await self._store.current_revision()
        current = await self._store.get(key) is not None
        yield current
        events = self._store.watch_prefix(key, start_revision=revision + 1)
        async with contextlib.aclosing(events):
            async for event in events:
                if event.key != key:
                    continue
                now = event.kind is EventKind.PUT
                if now != current:
                    current = now
                    yield current

    @staticmethod
    def _decode(kv: KeyValue) -> Decommissioned:
        bookie_id = kv.key[len(DECOMMISSIONED_PREFIX) :]
        try:
            record = msgpack.unpackb(kv.value, raw=False)
            return Decommissioned(bookie_id, int(record["ctime_ms"]))
        except (ValueError, KeyError, TypeError, msgpack.ExtraData) as error:
            raise InvalidMetadataError(f"decommission record {kv.key}: {error!r}") from None
