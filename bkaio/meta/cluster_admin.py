"""Operations on a whole cluster: describe it, nuke it, format it (the shell's clusterinfo,
nukeexistingcluster and metaformat, and GET /api/v1/bookie/cluster_info).

    info = await describe_cluster(metadata)
    report = await nuke_cluster(store, instance_id=...)    # or force=True
    instance_id = await format_cluster(store, force=True)

`nuke_cluster` deletes every key under the store's root, only when no bookie is registered and
the caller names the cluster's instance id (or forces it), as BookKeeper's
`nukeexistingcluster` does; the layout key goes first, so an interrupted nuke leaves a store that
counts as empty (running it again finishes it). Identity and creation are cluster.py's;
`open_metadata` opens only an initialised cluster.
Driver-independent.
"""

from __future__ import annotations

from dataclasses import dataclass

from bkaio.errors import MetadataError
from bkaio.meta import Metadata
from bkaio.meta.autorecovery import AUDITOR_KEY, UNDERREPLICATED_PREFIX, decodes_as_mark
from bkaio.meta.bookies import BOOKIES_PREFIX
from bkaio.meta.cluster import (
    LAYOUT_KEY,
    ClusterExistsError,
    initialise_cluster,
    read_instance_id,
    require_initialised,
)
from bkaio.meta.ledger_metadata import deserialize
from bkaio.meta.ledgers import LEDGERS_PREFIX, ledger_id_of
from bkaio.meta.records import COOKIES_PREFIX
from bkaio.meta.store import MetadataStore
from bkaio.meta.uri import shown_uri


def _location(store: MetadataStore) -> str:
    return shown_uri(store.uri)  # Its ?prefix= names the cluster; no password shown.


_NUKE_PAGE = 500  # Keys deleted per listing: bounded memory on a large cluster.
_LEDGER_PAGE = 500


class ClusterInUseError(MetadataError):
    """Bookies are still registered: the cluster cannot be nuked or formatted under them."""

    retriable = False


class InstanceIdMismatchError(MetadataError):
    """The instance id given as confirmation is not the cluster's."""

    retriable = False


async def registered_bookie_ids(store: MetadataStore) -> list[str]:
    """Bookies holding a registration (writable or read-only), sorted."""
    keys = await store.list_prefix(BOOKIES_PREFIX, keys_only=True)
    return sorted({kv.key.rsplit("/", 1)[1] for kv in keys})


@dataclass(frozen=True, slots=True)
class NukeReport:
    instance_id: str | None  # None: the store held no cluster (only stray keys, if any).
    keys_deleted: int


async def nuke_cluster(
    store: MetadataStore, *, instance_id: str | None = None, force: bool = False
) -> NukeReport:
    """Delete every key of the cluster: ledgers, cookies, marks, its identity.

    ClusterInUseError while any bookie is registered; InstanceIdMismatchError unless
    `instance_id` is the cluster's or `force` is set."""
    live = await registered_bookie_ids(store)
    if live:
        raise ClusterInUseError(
            f"bookies {', '.join(live[:5])}{'...' if len(live) > 5 else ''} are registered: "
            "stop every bookie before nuking or formatting the cluster"
        )
    current = await read_instance_id(store)
    if not force and current is not None and instance_id != current:
        raise InstanceIdMismatchError(
            f"instance id {instance_id!r} is not this cluster's ({current}); pass the right one "
            "(`bkaio shell clusterinfo` shows it) or --force"
        )
    deleted = int(await store.delete(LAYOUT_KEY))
    while True:
        page = await store.list_prefix("/", limit=_NUKE_PAGE, keys_only=True)
        if not page:
            break
        for kv in page:
            deleted += int(await store.delete(kv.key))
    return NukeReport(current, deleted)


async def format_cluster(store: MetadataStore, *, force: bool = False) -> str:
    """BookKeeper's metaformat: wipe whatever the store holds, then initialise a new cluster;
    its instance id. Wiping needs `force` (ClusterExistsError otherwise); registered bookies
    always refuse it (ClusterInUseError)."""
    current = await read_instance_id(store)
    if current is not None or await store.list_prefix("/", limit=1, keys_only=True):
        if not force:
            raise ClusterExistsError(
                f"metadata at {_location(store)} holds cluster "
                f"{current or '(uninitialised keys)'}: "
                "formatting deletes every ledger; pass --force to do it"
            )
        await nuke_cluster(store, force=True)
    return await initialise_cluster(store)


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    instance_id: str
    writable_bookies: tuple[str, ...]
    read_only_bookies: tuple[str, ...]
    # Known (a cookie in metadata), not registered, still named by some ledger: down or lost.
    unavailable_bookies: tuple[str, ...]
    # Known, not registered, named by no ledger: drained (decommissioned) or never used.
    decommissioned_bookies: tuple[str, ...]
    ledgers: int
    under_replicated_ledgers: int  # Marks that decode: what the auditor and workers list.
    # Records under /underreplicated/ that do not decode (skipped by autorecovery; an operator
    # inspects and deletes them).
    bad_underreplicated_records: int
    auditor: str | None
    autorecovery_enabled: bool

    def to_dict(self) -> dict[str, object]:
        """Ours in snake_case, then BookKeeper's ClusterInfoService fields under their names."""
        known = (
            len(self.writable_bookies) + len(self.read_only_bookies) + len(self.unavailable_bookies)
        )
        return {
            "instance_id": self.instance_id,
            "writable_bookies": list(self.writable_bookies),
            "read_only_bookies": list(self.read_only_bookies),
            "unavailable_bookies": list(self.unavailable_bookies),
            "decommissioned_bookies": list(self.decommissioned_bookies),
            "ledgers": self.ledgers,
            "under_replicated_ledgers": self.under_replicated_ledgers,
            "bad_underreplicated_records": self.bad_underreplicated_records,
            "auditor": self.auditor,
            "autorecovery_enabled": self.autorecovery_enabled,
            "auditorElected": self.auditor is not None,
            "auditorId": self.auditor or "",
            "clusterUnderReplicated": self.under_replicated_ledgers > 0,
            "ledgerReplicationEnabled": self.autorecovery_enabled,
            "totalBookiesCount": known,
            "writableBookiesCount": len(self.writable_bookies),
            "readonlyBookiesCount": len(self.read_only_bookies),
            "unavailableBookiesCount": len(self.unavailable_bookies),
        }


async def _bookies_named_by_ledgers(store: MetadataStore) -> tuple[int, set[str]]:
    """How many ledgers there are and every bookie their ensembles name (one paged scan)."""
    count = 0
    named: set[str] = set()
    async for kv in store.iterate_prefix(LEDGERS_PREFIX, page_size=_LEDGER_PAGE):
        count += 1
        record = deserialize(kv.value, ledger_id=ledger_id_of(kv.key), version=kv.version)
        for _first, ensemble in record.ensembles:
            named.update(ensemble)
    return count, named


async def _under_replication(store: MetadataStore) -> tuple[int, int]:
    """Records under /underreplicated/ that decode as marks, and those that do not (one paged
    scan; `decodes_as_mark` is the listing's decoder, so the first figure is what autorecovery
    lists and the auditor's gauge shows)."""
    marks = bad = 0
    async for kv in store.iterate_prefix(UNDERREPLICATED_PREFIX, page_size=_LEDGER_PAGE):
        if decodes_as_mark(kv.key, kv.value):
            marks += 1
        else:
            bad += 1
    return marks, bad


async def describe_cluster(metadata: Metadata) -> ClusterInfo:
    """Instance id, bookies by state, ledgers, under-replication and auditor, in one call."""
    store = metadata.store
    instance_id = await require_initialised(store)
    registered = await metadata.bookies.list()
    writable = tuple(b.bookie_id for b in registered if not b.read_only)
    read_only = tuple(b.bookie_id for b in registered if b.read_only)
    cookies = await store.list_prefix(COOKIES_PREFIX, keys_only=True)
    known = {kv.key[len(COOKIES_PREFIX) :] for kv in cookies}
    ledgers, named = await _bookies_named_by_ledgers(store)
    absent = known - set(writable) - set(read_only)
    under_replicated, bad_records = await _under_replication(store)
    auditor = await store.get(AUDITOR_KEY)
    return ClusterInfo(
        instance_id=instance_id,
        writable_bookies=writable,
        read_only_bookies=read_only,
        unavailable_bookies=tuple(sorted(absent & named)),
        decommissioned_bookies=tuple(sorted(absent - named)),
        ledgers=ledgers,
        under_replicated_ledgers=under_replicated,
        bad_underreplicated_records=bad_records,
        auditor=None if auditor is None else auditor.value.decode(),
        autorecovery_enabled=await metadata.underreplication.is_enabled(),
    )
