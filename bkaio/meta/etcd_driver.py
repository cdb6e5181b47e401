"""The production metadata driver: etcd v3 through aetcd's gRPC stubs.

Owns the mapping of `MetadataStore` calls to etcd requests and transactions. The connection to
etcd (channels to the members, failover, TLS and user/password, retries on lost connections)
is bkaio/meta/etcd_connection.py's; watches that outlive connections and members are
bkaio/meta/etcd_watch.py's. Must not import `sqlite3`, `protocol` or `journal`.

aetcd's high-level `Client` lacks range limits, TLS and reconnecting watches, so this driver
uses aetcd's generated stubs (`aetcd.rpc`) directly.

A write that etcd may or may not have applied (the connection broke while a compare-and-swap
or a versioned delete was in flight) raises MetadataOutcomeUnknownError: re-read the key and
decide (bkaio/meta/conditional.py). A member that is partitioned or stopped answers nothing,
which only a deadline notices: the connection gives its member the URI's attempt_timeout before
it moves on (bkaio/meta/etcd_connection.py; a conditional write then ends as
MetadataOutcomeUnknownError, every other request, `idempotent`, is sent again), and lease
keep-alives use at most a quarter of the lease's TTL (at least 1 s), so a bookie keeps its
registration while the connection moves to another member (tests/integration/meta/
test_etcd_cluster.py kills the leader and stops a member mid-write).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncGenerator
from typing import Any

from aetcd import rpc

from bkaio.errors import ConfigError, MetadataError, MetadataVersionError
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.etcd_watch import watch_etcd_prefix
from bkaio.meta.store import (
    KeyValue,
    Lease,
    MetadataStore,
    PrefixSnapshot,
    WatchEvent,
    check_key,
    prefix_end,
)
from bkaio.meta.uri import EtcdUri, parse_etcd_uri


class EtcdLease(Lease):
    def __init__(
        self, store: EtcdMetadataStore, lease_id: int, ttl_seconds: float, requested_at: float
    ) -> None:
        super().__init__(lease_id, ttl_seconds, requested_at=requested_at)
        self._store = store

    async def keep_alive(self) -> None:
        # Each RPC ends well inside the TTL, so that a silent member is left for another while
        # the lease still lives (Lease.attempt_timeout_seconds).
        await self._store._keep_alive(self.id, attempt_timeout=self.attempt_timeout_seconds)

    async def _revoke(self) -> None:
        await self._store._revoke(self.id)


class EtcdMetadataStore(MetadataStore):
    """`etcd://host:port[,host:port]/prefix`: every key lives under the URI's prefix."""

    def __init__(self, uri: str, parsed: EtcdUri) -> None:
        self.uri = uri
        self._config = parsed
        self._root = parsed.root
        self._connection = EtcdConnection(uri, parsed)

    @classmethod
    async def open(
        cls, uri: str, *, connect_timeout_seconds: float | None = None
    ) -> EtcdMetadataStore:
        """Connect, and wait for a first answer for at most `connect_timeout_seconds` (default:
        the URI's `connect_timeout`, 5 s): an unreachable etcd fails now, not at first use."""
        parsed = parse_etcd_uri(uri)
        if connect_timeout_seconds is not None:
            if not connect_timeout_seconds > 0:
                raise ConfigError(
                    f"metadata connect timeout {connect_timeout_seconds} must be > 0 seconds"
                )
            parsed = dataclasses.replace(parsed, connect_timeout_seconds=connect_timeout_seconds)
        store = cls(uri, parsed)
        try:
            await store._connection.connect()
            request = rpc.RangeRequest(key=(store._root or "/").encode(), count_only=True)
            await store._range("connect", request, retry_seconds=parsed.connect_timeout_seconds)
        except BaseException:
            await store.close()
            raise
        return store

    def _full(self, key: str) -> bytes:
        check_key(key)
        return (self._root + key).encode()

    def _key_value(self, kv: Any) -> KeyValue:
        return KeyValue(
            key=kv.key.decode()[len(self._root) :],
            value=bytes(kv.value),
            version=kv.mod_revision,
            create_revision=kv.create_revision,
            lease=kv.lease,
        )

    async def _range(self, what: str, request: Any, *, retry_seconds: float | None = None) -> Any:
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            return await self._connection.kv.Range(
                request, timeout=timeout, metadata=self._connection.metadata
            )

        return await self._connection.retrying(
            what, call, idempotent=True, retry_seconds=retry_seconds
        )

    async def _txn(self, what: str, request: Any, *, idempotent: bool) -> Any:
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            return await self._connection.kv.Txn(
                request, timeout=timeout, metadata=self._connection.metadata
            )

        try:
            return await self._connection.retrying(what, call, idempotent=idempotent)
        except MetadataError as error:
            if "lease not found" in str(error):
                raise LeaseExpiredError(f"etcd {what}: lease expired or revoked") from None
            raise

    # -- key/value --------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        response = await self._range(f"get {key}", rpc.RangeRequest(key=self._full(key)))
        return self._key_value(response.kvs[0]) if response.kvs else None

    def _put_request(self, full_key: bytes, value: bytes, lease: Lease | None) -> Any:
        assert isinstance(value, bytes), type(value)
        return rpc.PutRequest(key=full_key, value=value, lease=0 if lease is None else lease.id)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        request = rpc.TxnRequest(
            success=[rpc.RequestOp(request_put=self._put_request(self._full(key), value, lease))]
        )
        response = await self._txn(f"put {key}", request, idempotent=True)
        return int(response.header.revision)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        assert expected_version >= 0, expected_version
        full_key = self._full(key)
        request = rpc.TxnRequest(
            compare=[self._version_is(full_key, expected_version)],
            success=[rpc.RequestOp(request_put=self._put_request(full_key, value, lease))],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=full_key, keys_only=True))],
        )
        response = await self._txn(f"compare-and-swap {key}", request, idempotent=False)
        if not response.succeeded:
            raise MetadataVersionError(
                f"metadata key {key}: version is {self._failed_version(response)},"
                f" expected {expected_version}"
            )
        return int(response.header.revision)

    @staticmethod
    def _version_is(full_key: bytes, version: int) -> Any:
        return rpc.Compare(
            key=full_key,
            target=rpc.Compare.MOD,
            result=rpc.Compare.EQUAL,
            mod_revision=version,
        )

    @staticmethod
    def _failed_version(response: Any) -> int:
        kvs = response.responses[0].response_range.kvs
        return int(kvs[0].mod_revision) if kvs else 0

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        full_key = self._full(key)
        delete_op = rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=full_key))
        if expected_version is None:
            response = await self._txn(
                f"delete {key}", rpc.TxnRequest(success=[delete_op]), idempotent=True
            )
            return bool(response.responses[0].response_delete_range.deleted)
        request = rpc.TxnRequest(
            compare=[self._version_is(full_key, expected_version)],
            success=[delete_op],
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=full_key, keys_only=True))],
        )
        response = await self._txn(f"delete {key}", request, idempotent=False)
        if response.succeeded:
            return bool(response.responses[0].response_delete_range.deleted)
        current = self._failed_version(response)
        if current == 0:
            return False
        raise MetadataVersionError(
            f"metadata key {key}: version is {current}, expected {expected_version}; not deleted"
        )

    async def list_prefix(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> list[KeyValue]:
        assert limit is None or limit > 0, limit
        full_prefix = self._full(prefix)
        lower = full_prefix if start_after is None else self._full(start_after) + b"\0"
        request = rpc.RangeRequest(
            key=lower,
            range_end=prefix_end(full_prefix.decode()).encode(),
            limit=limit or 0,
            keys_only=keys_only,
            sort_order=rpc.RangeRequest.ASCEND,
            sort_target=rpc.RangeRequest.KEY,
        )
        response = await self._range(f"list {prefix}", request)
        return [self._key_value(kv) for kv in response.kvs]

    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        full_prefix = self._full(prefix)
        request = rpc.RangeRequest(
            key=full_prefix, range_end=prefix_end(full_prefix.decode()).encode()
        )
        response = await self._range(f"list {prefix}", request)
        return PrefixSnapshot(
            kvs=[self._key_value(kv) for kv in response.kvs],
            revision=int(response.header.revision),
        )

    async def current_revision(self) -> int:
        request = rpc.RangeRequest(key=(self._root or "/").encode(), count_only=True)
        response = await self._range("current revision", request)
        return int(response.header.revision)

    # -- leases -----------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        if not ttl_seconds > 0:
            raise MetadataError(f"lease TTL must be > 0 seconds, not {ttl_seconds}")
        request = rpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl_seconds)))
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            return await self._connection.lease.LeaseGrant(
                request, timeout=timeout, metadata=self._connection.metadata
            )

        # An unconfirmed grant leaves at most an orphan lease, which expires by itself.
        requested_at = asyncio.get_running_loop().time()
        response = await self._connection.retrying("grant lease", call, idempotent=True)
        if response.error:
            raise MetadataError(f"etcd grant lease failed: {response.error}")
        lease = EtcdLease(self, int(response.ID), float(response.TTL), requested_at)
        return self._track_lease(lease)

    async def _keep_alive(self, lease_id: int, *, attempt_timeout: float) -> None:
        timeout = min(self._config.operation_timeout_seconds, attempt_timeout)

        async def call() -> Any:
            stream = self._connection.lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=timeout,
                metadata=self._connection.metadata,
            )
            async for reply in stream:
                return reply
            return None

        reply = await self._connection.retrying(
            f"keep lease {lease_id} alive", call, idempotent=True
        )
        if reply is None or reply.TTL <= 0:
            raise LeaseExpiredError(f"lease {lease_id} expired or was revoked")

    async def _revoke(self, lease_id: int) -> None:
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            request = rpc.LeaseRevokeRequest(ID=lease_id)
            return await self._connection.lease.LeaseRevoke(
                request, timeout=timeout, metadata=self._connection.metadata
            )

        try:
            await self._connection.retrying(f"revoke lease {lease_id}", call, idempotent=True)
        except MetadataError as error:
            if "not found" in str(error):
                raise LeaseExpiredError(f"lease {lease_id} expired or was revoked") from None
            raise

    # -- watches ----------------------------------------------------------------------------

    def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        return watch_etcd_prefix(
            self._connection,
            self._root,
            prefix,
            start_revision=start_revision,
            current_revision=self.current_revision,
        )

    # -- life cycle -------------------------------------------------------------------------

    async def close(self) -> None:
        if self._connection.closed:
            return
        await self._stop_keep_alives()
        await self._connection.close()
