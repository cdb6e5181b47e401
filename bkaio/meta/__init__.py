"""Cluster metadata: ledgers, bookies, cookies, autorecovery and namespaces over one store.

`open_metadata(uri)` picks the driver from the URI scheme (etcd:// for production, sqlite://
for a single host), makes sure the cluster layout and instance id exist, and returns the
`Metadata` facade every other package uses. See docs/metadata.md.
"""

from __future__ import annotations

import uuid
from types import TracebackType

import structlog

from bkaio.errors import ConfigError, MetadataVersionError
from bkaio.meta.autorecovery import (
    AuditorElection,
    AuditorLeadership,
    UnderreplicatedLedger,
    UnderReplicationManager,
)
from bkaio.meta.bookies import BookieInfo, BookieRegistration, BookieRegistry
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

__all__ = [
    "AuditorElection",
    "AuditorLeadership",
    "BookieInfo",
    "BookieRegistration",
    "BookieRegistry",
    "CookieStore",
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
    "open_metadata",
    "open_store",
]

log = structlog.get_logger(__name__)

LAYOUT_KEY = "/layout"
LAYOUT_VERSION = b"1"
INSTANCE_ID_KEY = "/instanceid"


async def open_store(uri: str) -> MetadataStore:
    """Just the driver for `uri`, without the cluster layout check."""
    scheme = uri.partition("://")[0]
    if scheme == "etcd":
        from bkaio.meta.etcd_driver import EtcdMetadataStore

        return await EtcdMetadataStore.open(uri)
    if scheme == "sqlite":
        from bkaio.meta.sqlite_driver import SqliteMetadataStore

        return await SqliteMetadataStore.open(uri)
    raise ConfigError(
        f"metadata URI {uri!r}: unknown scheme {scheme!r}; use etcd://host:port/prefix"
        " or sqlite:///path/meta.db"
    )


class Metadata:
    """Everything bkaio keeps in the metadata store, behind one connection."""

    def __init__(self, store: MetadataStore, instance_id: str, *, id_block_size: int) -> None:
        self.store = store
        self.instance_id = instance_id
        self.idgen = LedgerIdGenerator(store, block_size=id_block_size)
        self.ledgers = LedgerManager(store, self.idgen)
        self.bookies = BookieRegistry(store)
        self.cookies = CookieStore(store)
        self.underreplication = UnderReplicationManager(store)
        self.auditor = AuditorElection(store)
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


async def _create_if_absent(store: MetadataStore, key: str, value: bytes) -> bytes:
    """The value of `key`, writing `value` first if the key does not exist yet."""
    while True:
        kv = await store.get(key)
        if kv is not None:
            return kv.value
        try:
            await store.compare_and_swap(key, value, expected_version=0)
        except MetadataVersionError:
            continue  # Another process initialised it first: read theirs.
        except MetadataOutcomeUnknownError:
            continue
        return value


async def open_metadata(uri: str, *, id_block_size: int = 1000) -> Metadata:
    """Connect to the metadata store at `uri`; initialise the cluster layout on first use."""
    store = await open_store(uri)
    try:
        layout = await _create_if_absent(store, LAYOUT_KEY, LAYOUT_VERSION)
        if layout != LAYOUT_VERSION:
            raise ConfigError(
                f"metadata at {uri}: layout version {layout!r} is not {LAYOUT_VERSION!r};"
                " this build cannot use it"
            )
        instance_id = (
            await _create_if_absent(store, INSTANCE_ID_KEY, uuid.uuid4().hex.encode())
        ).decode()
    except BaseException:
        await store.close()
        raise
    log.debug("metadata_opened", uri=uri, instance_id=instance_id)
    return Metadata(store, instance_id, id_block_size=id_block_size)
