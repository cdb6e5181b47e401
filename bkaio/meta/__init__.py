"""Cluster metadata: ledgers, bookies, cookies, autorecovery and namespaces over one store.

`open_metadata(uri)` picks the driver from the URI scheme (etcd:// for production, sqlite://
for a single host), checks that the store holds an initialised cluster (`bkaio.meta.cluster`:
layout version and instance id, written only by `initialise_cluster`), and returns the
`Metadata` facade every other package uses. See docs/metadata.md.
"""

from __future__ import annotations

from types import TracebackType

import structlog
from prometheus_client import REGISTRY, CollectorRegistry

from bkaio.errors import ConfigError
from bkaio.meta.autorecovery import (
    AuditorElection,
    AuditorLeadership,
    BadUnderreplicationRecord,
    MarkResult,
    UnderreplicatedLedger,
    UnderReplicationManager,
)
from bkaio.meta.bookies import BookieInfo, BookieRegistration, BookieRegistry
from bkaio.meta.cluster import (
    ClusterExistsError,
    ClusterNotInitialisedError,
    initialise_cluster,
    read_instance_id,
    require_initialised,
)
from bkaio.meta.decommission import Decommissioned, DecommissionRegistry
from bkaio.meta.errors import (
    InvalidMetadataError,
    LeaseExpiredError,
    LedgerExistsError,
    MetadataOutcomeUnknownError,
    WatchCompactedError,
)
from bkaio.meta.ledger_metadata import DigestType, LedgerMetadata, LedgerState
from bkaio.meta.ledgers import LedgerIdGenerator, LedgerManager
from bkaio.meta.records import CookieStore, NamespaceStore, VersionedCookie, VersionedRecord
from bkaio.meta.store import EventKind, KeyValue, Lease, MetadataStore, WatchEvent
from bkaio.meta.uri import shown_uri

__all__ = [
    "AuditorElection",
    "AuditorLeadership",
    "BadUnderreplicationRecord",
    "BookieInfo",
    "BookieRegistration",
    "BookieRegistry",
    "ClusterExistsError",
    "ClusterNotInitialisedError",
    "CookieStore",
    "DecommissionRegistry",
    "Decommissioned",
    "DigestType",
    "EventKind",
    "InvalidMetadataError",
    "KeyValue",
    "Lease",
    "LeaseExpiredError",
    "LedgerExistsError",
    "LedgerIdGenerator",
    "LedgerManager",
    "LedgerMetadata",
    "LedgerState",
    "MarkResult",
    "Metadata",
    "MetadataOutcomeUnknownError",
    "MetadataStore",
    "NamespaceStore",
    "UnderReplicationManager",
    "UnderreplicatedLedger",
    "VersionedCookie",
    "VersionedRecord",
    "WatchCompactedError",
    "WatchEvent",
    "initialise_cluster",
    "initialise_cluster_at",
    "open_metadata",
    "open_store",
    "read_instance_id",
    "require_initialised",
]

log = structlog.get_logger(__name__)


async def open_store(
    uri: str, *, create: bool = True, connect_timeout_seconds: float | None = None
) -> MetadataStore:
    """Just the driver for `uri`, without the cluster check.

    `create=False`: an SQLite file that does not exist is ClusterNotInitialisedError instead of
    a new database. `connect_timeout_seconds` bounds the first contact with etcd (default: the
    URI's `connect_timeout` option, 5 s).
    """
    scheme = uri.partition("://")[0]
    if scheme == "etcd":
        from bkaio.meta.etcd_driver import EtcdMetadataStore

        return await EtcdMetadataStore.open(uri, connect_timeout_seconds=connect_timeout_seconds)
    if scheme == "sqlite":
        from bkaio.meta.sqlite_driver import SqliteMetadataStore

        return await SqliteMetadataStore.open(uri, create=create)
    raise ConfigError(
        f"metadata URI {shown_uri(uri)!r}: unknown scheme {scheme!r}; use etcd://host:port/prefix"
        " or sqlite:///path/meta.db"
    )


class Metadata:
    """Everything bkaio keeps in the metadata store, behind one connection."""

    def __init__(
        self,
        store: MetadataStore,
        instance_id: str,
        *,
        id_block_size: int,
        metrics_registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.store = store
        self.instance_id = instance_id
        self.idgen = LedgerIdGenerator(store, block_size=id_block_size)
        self.ledgers = LedgerManager(store, self.idgen)
        self.bookies = BookieRegistry(store)
        self.cookies = CookieStore(store)
        self.underreplication = UnderReplicationManager(store, metrics_registry)
        self.auditor = AuditorElection(store)
        self.decommissioned = DecommissionRegistry(store)
        self.namespaces = NamespaceStore(store)

    async def close(self) -> None:
        await self.store.close()

    async def __aenter__(self) -> Metadata:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def open_metadata(
    uri: str,
    *,
    id_block_size: int = 1000,
    connect_timeout_seconds: float | None = None,
    metrics_registry: CollectorRegistry = REGISTRY,
) -> Metadata:
    """Connect to the cluster whose metadata lives at `uri`.

    Refuses (ClusterNotInitialisedError, saying how to create one) a store that holds no
    initialised cluster: only `initialise_cluster` creates one. `metrics_registry`: where the
    metadata layer's counters go (the process's metrics page; bad under-replication records).
    """
    store = await open_store(uri, create=False, connect_timeout_seconds=connect_timeout_seconds)
    try:
        instance_id = await require_initialised(store)
    except BaseException:
        await store.close()
        raise
    log.debug("metadata_opened", uri=uri.partition("?")[0], instance_id=instance_id)
    return Metadata(
        store, instance_id, id_block_size=id_block_size, metrics_registry=metrics_registry
    )


async def initialise_cluster_at(
    uri: str, *, exist_ok: bool = False, connect_timeout_seconds: float | None = None
) -> str:
    """`initialise_cluster` on the store at `uri` (created if it is a new SQLite file)."""
    store = await open_store(uri, create=True, connect_timeout_seconds=connect_timeout_seconds)
    try:
        return await initialise_cluster(store, exist_ok=exist_ok)
    finally:
        await store.close()
