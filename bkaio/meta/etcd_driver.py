"""The production metadata driver: etcd v3 through aetcd's gRPC stubs.

Owns the connection to etcd (one gRPC channel, optionally TLS and user/password), the
mapping of `MetadataStore` calls to etcd requests and transactions, and retries on lost
connections. Must not import `sqlite3`, `protocol` or `journal`.

aetcd's high-level `Client` lacks range limits, TLS and reconnecting watches, so this driver
uses aetcd's generated stubs (`aetcd.rpc`) directly.

Retries: a request that fails because etcd is unreachable is retried with jittered exponential
backoff (bkaio/backoff.py) for up to `retry_seconds` (URI option, default 30 s), so a client
rides out an etcd restart and the clients of one etcd do not retry in lock step. Reads,
unconditional puts, deletes and lease calls are retried whatever happened. A conditional write
(compare-and-swap, versioned delete) is retried only when gRPC says it never left this host;
if the connection broke while it was in flight, the write may or may not have been applied,
and MetadataOutcomeUnknownError tells the caller to re-read the key and decide.

Watches re-open after any connection error from the revision after the last event they
delivered, so no event is lost or repeated; only an etcd compaction past that revision ends
them (WatchCompactedError).

Several members (`etcd://a:2379,b:2379,c:2379/prefix`): one gRPC channel per member, and every
request goes to the current one. A request that finds it unreachable or silent (UNAVAILABLE,
DEADLINE_EXCEEDED) moves the store to the next member before it is retried, and the watches
open on the old member re-open on the new one. A member that is killed refuses connections at
once; one that is partitioned or stopped keeps its connections open and answers nothing, which
only a deadline notices: lease keep-alives use a quarter of the lease's TTL (at least 1 s), so
a bookie keeps its registration, and a watch that hears nothing for WATCH_IDLE_SECONDS asks the
member for a progress report and moves on when none comes (tests/integration/meta/
test_etcd_cluster.py kills the leader and stops a member mid-write).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import structlog
from aetcd import rpc

from bkaio.backoff import Backoff
from bkaio.errors import ConfigError, MetadataError, MetadataVersionError
from bkaio.meta.errors import LeaseExpiredError, MetadataOutcomeUnknownError, WatchCompactedError
from bkaio.meta.store import (
    EventKind,
    KeyValue,
    Lease,
    MetadataStore,
    PrefixSnapshot,
    WatchEvent,
    check_key,
    prefix_end,
)
from bkaio.meta.uri import EtcdUri, parse_etcd_uri

log = structlog.get_logger(__name__)

T = TypeVar("T")

_CHANNEL_OPTIONS = [
    # Reconnect quickly after an etcd restart instead of gRPC's default backoff of up to 120 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Notice a silently dead peer (host gone, SIGSTOP) within about 15 s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
# gRPC details saying the request never reached etcd (or etcd refused it before applying).
_NOT_SENT_MARKERS = ("failed to connect", "connection refused", "no leader", "not capable")
_MIN_BACKOFF_SECONDS = 0.05
_MAX_BACKOFF_SECONDS = 1.0
# A watch that has received nothing for this long asks for a progress report; after three
# such periods without any answer its member counts as lost.
WATCH_IDLE_SECONDS = 2.0
WATCH_SILENT_PERIODS = 3
# A lease keep-alive attempt is cut off after a quarter of the TTL, but never sooner than this.
KEEP_ALIVE_MIN_ATTEMPT_SECONDS = 1.0


def _never_sent(error: Any) -> bool:
    details = (error.details() or "").lower()
    return error.code() == rpc.StatusCode.UNAVAILABLE and any(
        marker in details for marker in _NOT_SENT_MARKERS
    )


def _connection_lost(error: Any) -> bool:
    return error.code() in (rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED)


class EtcdLease(Lease):
    def __init__(self, store: EtcdMetadataStore, lease_id: int, ttl_seconds: float) -> None:
        super().__init__(lease_id, ttl_seconds)
        self._store = store

    async def keep_alive(self) -> None:
        # Each attempt must end well inside the TTL, so that a silent member is left for another
        # while the lease still lives; but not so soon that a busy member counts as silent.
        attempt_timeout = max(KEEP_ALIVE_MIN_ATTEMPT_SECONDS, self.ttl_seconds / 4)
        await self._store._keep_alive(self.id, attempt_timeout=attempt_timeout)

    async def _revoke(self) -> None:
        await self._store._revoke(self.id)


class _Member:
    """The channel to one etcd member and its stubs."""

    def __init__(self, address: str, channel: Any) -> None:
        self.address = address
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)
        self.auth = rpc.AuthStub(channel)


class EtcdMetadataStore(MetadataStore):
    """`etcd://host:port[,host:port]/prefix`: every key lives under the URI's prefix."""

    def __init__(self, uri: str, parsed: EtcdUri) -> None:
        self.uri = uri
        self._config = parsed
        self._root = parsed.root
        self._members: list[_Member] = []
        self._current = 0  # Index into _members of the member requests go to.
        # Open watch calls -> the member index they were opened on, to re-open them elsewhere.
        self._watch_calls: dict[Any, int] = {}
        self._moved_calls: set[Any] = set()  # Watch calls cancelled to move them elsewhere.
        self._metadata: tuple[tuple[str, str], ...] | None = None
        self._closed = False

    @property
    def _kv(self) -> Any:
        return self._members[self._current].kv

    @property
    def _lease(self) -> Any:
        return self._members[self._current].lease

    @property
    def _watch(self) -> Any:
        return self._members[self._current].watch

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
            await store._connect()
            request = rpc.RangeRequest(key=(store._root or "/").encode(), count_only=True)
            await store._range("connect", request, retry_seconds=parsed.connect_timeout_seconds)
        except BaseException:
            await store.close()
            raise
        return store

    # -- connection -------------------------------------------------------------------------

    async def _connect(self) -> None:
        config = self._config
        credentials: Any = None
        if config.ca_file or config.cert_file:
            import grpc  # type: ignore[import-untyped]  # Only the TLS path needs it.

            def read(path: str | None) -> bytes | None:
                if path is None:
                    return None
                try:
                    return Path(path).read_bytes()
                except OSError as error:
                    raise ConfigError(
                        f"metadata URI: cannot read TLS file {path}: {error}"
                    ) from None

            credentials = grpc.ssl_channel_credentials(
                root_certificates=read(config.ca_file),
                private_key=read(config.key_file),
                certificate_chain=read(config.cert_file),
            )
        for host, port in config.endpoints:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if credentials is None:
                channel = rpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
            else:
                options = [*_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", host)]
                channel = rpc.secure_channel(address, credentials, options=options)
            self._members.append(_Member(address, channel))
        if config.user is not None:
            await self._authenticate()

    def _fail_over(self, used: int, code: Any) -> None:
        """Member `used` did not answer: send what follows to the next one, and move the watches
        open on it there too. No-op with one member, or when another request already moved on."""
        if len(self._members) == 1 or self._current != used:
            return
        self._current = (used + 1) % len(self._members)
        log.warning(
            "etcd_member_failover", lost=self._members[used].address,
            now=self._members[self._current].address, code=code.name,
        )  # fmt: skip
        for call, member in list(self._watch_calls.items()):
            if member == used:
                self._moved_calls.add(call)
                call.cancel()

    async def _authenticate(self) -> None:
        request = rpc.AuthenticateRequest(name=self._config.user, password=self._config.password)

        async def call() -> Any:
            return await self._members[self._current].auth.Authenticate(
                request, timeout=self._config.operation_timeout_seconds
            )

        response = await self._retrying(
            "authenticate",
            call,
            idempotent=True,
            reauth=False,
            retry_seconds=self._config.connect_timeout_seconds,
        )
        self._metadata = (("token", response.token),)

    async def _retrying(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        idempotent: bool,
        reauth: bool = True,
        retry_seconds: float | None = None,
    ) -> T:
        """`call()`, retried while etcd is unreachable for up to the URI's retry_seconds.

        With `retry_seconds` (first contact: connecting, logging in), that bound instead, shared
        by the members: an attempt that one member leaves unanswered for its share moves on to
        the next, so a silent member is passed over and a silent cluster reported in time.
        """
        loop = asyncio.get_running_loop()
        budget = self._config.retry_seconds if retry_seconds is None else retry_seconds
        deadline = loop.time() + budget
        backoff = Backoff(_MIN_BACKOFF_SECONDS, _MAX_BACKOFF_SECONDS)
        while True:
            if self._closed:
                raise MetadataError(f"metadata store {self.uri} is closed")
            used = self._current
            try:
                if retry_seconds is None:
                    return await call()
                assert idempotent, what  # A cut-off write would leave its outcome unknown.
                share = budget / len(self._members)
                async with asyncio.timeout_at(min(deadline, loop.time() + share)):
                    return await call()
            except TimeoutError:
                if loop.time() < deadline - 0.01:
                    self._fail_over(used, rpc.StatusCode.DEADLINE_EXCEEDED)
                    continue
                raise MetadataError(
                    f"etcd {what}: no answer from {self._endpoints_text()} within {budget} s"
                ) from None
            except rpc.AioRpcError as error:
                code = error.code()
                if code == rpc.StatusCode.UNAUTHENTICATED and reauth and self._config.user:
                    reauth = False  # The token expired: log in again, once.
                    await self._authenticate()
                    continue
                if not _connection_lost(error):
                    raise MetadataError(
                        f"etcd {what} failed: {code.name}: {error.details()}"
                    ) from None
                self._fail_over(used, code)
                if not idempotent and not _never_sent(error):
                    raise MetadataOutcomeUnknownError(
                        f"etcd {what}: connection lost while the write was in flight"
                        f" ({code.name}: {error.details()}); re-read the key to learn the outcome"
                    ) from None
                delay = backoff.next_delay()
                if loop.time() + delay > deadline:
                    raise MetadataError(
                        f"etcd {what}: {self._endpoints_text()} unreachable for"
                        f" {budget} s: {error.details()}"
                    ) from None
                log.warning(
                    "etcd_retrying", operation=what, delay_seconds=round(delay, 3), code=code.name
                )
                await asyncio.sleep(delay)

    def _endpoints_text(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self._config.endpoints)

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
            return await self._kv.Range(request, timeout=timeout, metadata=self._metadata)

        return await self._retrying(what, call, idempotent=True, retry_seconds=retry_seconds)

    async def _txn(self, what: str, request: Any, *, idempotent: bool) -> Any:
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            return await self._kv.Txn(request, timeout=timeout, metadata=self._metadata)

        try:
            return await self._retrying(what, call, idempotent=idempotent)
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
            return await self._lease.LeaseGrant(request, timeout=timeout, metadata=self._metadata)

        # An unconfirmed grant leaves at most an orphan lease, which expires by itself.
        response = await self._retrying("grant lease", call, idempotent=True)
        if response.error:
            raise MetadataError(f"etcd grant lease failed: {response.error}")
        return self._track_lease(EtcdLease(self, int(response.ID), float(response.TTL)))

    async def _keep_alive(self, lease_id: int, *, attempt_timeout: float) -> None:
        timeout = min(self._config.operation_timeout_seconds, attempt_timeout)

        async def call() -> Any:
            stream = self._lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]),
                timeout=timeout,
                metadata=self._metadata,
            )
            async for reply in stream:
                return reply
            return None

        reply = await self._retrying(f"keep lease {lease_id} alive", call, idempotent=True)
        if reply is None or reply.TTL <= 0:
            raise LeaseExpiredError(f"lease {lease_id} expired or was revoked")

    async def _revoke(self, lease_id: int) -> None:
        timeout = self._config.operation_timeout_seconds

        async def call() -> Any:
            request = rpc.LeaseRevokeRequest(ID=lease_id)
            return await self._lease.LeaseRevoke(request, timeout=timeout, metadata=self._metadata)

        try:
            await self._retrying(f"revoke lease {lease_id}", call, idempotent=True)
        except MetadataError as error:
            if "not found" in str(error):
                raise LeaseExpiredError(f"lease {lease_id} expired or was revoked") from None
            raise

    # -- watches ----------------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        full_prefix = self._full(prefix)
        range_end = prefix_end(full_prefix.decode()).encode()
        if start_revision is None:
            start_revision = await self.current_revision() + 1
        next_revision = start_revision
        backoff = Backoff(_MIN_BACKOFF_SECONDS, _MAX_BACKOFF_SECONDS)
        while not self._closed:
            create = rpc.WatchCreateRequest(
                key=full_prefix, range_end=range_end, start_revision=next_revision
            )
            outgoing: asyncio.Queue[Any] = asyncio.Queue(maxsize=WATCH_SILENT_PERIODS + 1)
            outgoing.put_nowait(rpc.WatchRequest(create_request=create))
            used = self._current
            call = self._watch.Watch(_requests(outgoing), metadata=self._metadata)
            self._watch_calls[call] = used
            heard = _Heard(asyncio.get_running_loop().time())
            keeper = asyncio.get_running_loop().create_task(
                self._keep_watch_honest(call, used, outgoing, heard), name=f"etcd-watch {prefix}"
            )
            try:
                async for response in call:
                    heard.at = asyncio.get_running_loop().time()
                    if response.compact_revision:
                        raise WatchCompactedError(
                            f"watch on {prefix}: etcd compacted revisions up to"
                            f" {response.compact_revision}, after {next_revision - 1}"
                        )
                    if response.canceled:
                        raise MetadataError(f"watch on {prefix} canceled: {response.cancel_reason}")
                    for event in response.events:
                        heard.consumer_busy = True  # Its time at the consumer is not silence.
                        yield self._watch_event(event)
                        heard.consumer_busy = False
                        heard.at = asyncio.get_running_loop().time()
                        next_revision = int(event.kv.mod_revision) + 1
                    backoff.reset()
            except asyncio.CancelledError:
                if call not in self._moved_calls or _cancelling():
                    raise
                continue  # Moved to another member: re-open there at once.
            except rpc.AioRpcError as error:
                if call in self._moved_calls:
                    continue
                if self._closed or error.code() == rpc.StatusCode.CANCELLED:
                    return
                if not _connection_lost(error) and error.code() != rpc.StatusCode.UNKNOWN:
                    raise MetadataError(
                        f"watch on {prefix} failed: {error.code().name}: {error.details()}"
                    ) from None
                self._fail_over(used, error.code())
                log.warning(
                    "etcd_watch_reconnecting", prefix=prefix, from_revision=next_revision,
                    delay_seconds=round(backoff.step(), 3), code=error.code().name,
                )  # fmt: skip
            finally:
                keeper.cancel()
                self._watch_calls.pop(call, None)
                self._moved_calls.discard(call)
                # cancel() does nothing to a call that already ended (etcd went away): ending
                # the request stream is what lets gRPC's task that reads it finish.
                with contextlib.suppress(asyncio.QueueFull):
                    outgoing.put_nowait(None)
                call.cancel()
            await asyncio.sleep(backoff.next_delay())

    async def _keep_watch_honest(
        self, call: Any, used: int, outgoing: asyncio.Queue[Any], heard: _Heard
    ) -> None:
        """While the watch hears nothing, ask its member for a progress report every
        WATCH_IDLE_SECONDS; a member that answers none of WATCH_SILENT_PERIODS is lost."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(WATCH_IDLE_SECONDS)
                if heard.consumer_busy:
                    continue
                silent = loop.time() - heard.at
                if silent >= WATCH_IDLE_SECONDS * WATCH_SILENT_PERIODS:
                    if self._current == used:
                        self._fail_over(used, rpc.StatusCode.DEADLINE_EXCEEDED)
                    if call in self._watch_calls:  # Single member, or moved by another request.
                        self._moved_calls.add(call)
                        call.cancel()
                    return
                if silent >= WATCH_IDLE_SECONDS and not outgoing.full():
                    outgoing.put_nowait(
                        rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())
                    )
        except Exception:  # A bug here must not pass silently, nor end the watch.
            log.exception("etcd_watch_keeper_failed")

    def _watch_event(self, event: Any) -> WatchEvent:
        kind = EventKind.DELETE if event.type == rpc.Event.DELETE else EventKind.PUT
        return WatchEvent(
            kind=kind,
            key=event.kv.key.decode()[len(self._root) :],
            value=b"" if kind is EventKind.DELETE else bytes(event.kv.value),
            revision=int(event.kv.mod_revision),
        )

    # -- life cycle -------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        await self._stop_keep_alives()
        self._closed = True
        for member in self._members:
            with contextlib.suppress(Exception):
                await member.channel.close()


@dataclass(slots=True)
class _Heard:
    """When a watch last received anything from etcd (loop time), and whether its consumer
    holds an event right now (the stream is not read meanwhile: not the member's silence)."""

    at: float
    consumer_busy: bool = False


def _cancelling() -> bool:
    """True when the current task itself is being cancelled (not just a call it waits on)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _requests(outgoing: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A watch stream's requests: the create, then progress requests as they are queued, until
    None (the watch is over) or the call is cancelled."""
    while (request := await outgoing.get()) is not None:
        yield request
