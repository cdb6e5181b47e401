"""The connection to etcd: one gRPC channel per member, the member requests go to, and retries.

Owns the channels (optionally TLS and user/password), the choice of the member every request
goes to, the move to the next member when one is lost, and the retry policy every etcd request
of the driver (bkaio/meta/etcd_driver.py) and its watches (bkaio/meta/etcd_watch.py) runs under.
Must not import `sqlite3`, `protocol` or `journal`.

Retries: a request that fails because etcd is unreachable is retried with jittered exponential
backoff (bkaio/backoff.py) for up to `retry_seconds` (URI option, default 30 s), so a client
rides out an etcd restart and the clients of one etcd do not retry in lock step. Reads,
unconditional puts, deletes and lease calls are retried whatever happened. A conditional write
(compare-and-swap, versioned delete) is retried only when gRPC says it never left this host;
if the connection broke while it was in flight, the write may or may not have been applied,
and MetadataOutcomeUnknownError tells the caller to re-read the key and decide.

Several members (`etcd://a:2379,b:2379,c:2379/prefix`): one gRPC channel per member, and every
request goes to the current one. A request that finds it unreachable or silent (UNAVAILABLE,
DEADLINE_EXCEEDED) moves the connection to the next member before it is retried, and the
watches open on the old member re-open on the new one.

A silent member (stopped, partitioned, its disk hung) keeps its connections open and answers
nothing; gRPC's keepalive cannot notice it sooner than etcd lets clients ping (5 s by default,
faster pings get the connection closed), so only a deadline does. A request that may be
repeated (`idempotent`) gives its member the URI's `attempt_timeout` (2 s) before it moves on,
and each later attempt twice as long, up to the operation `timeout`: a silent member is left
after 2 s, a slow one still gets the time to answer. A conditional write gets the same first
attempt, and unanswered by then it ends as MetadataOutcomeUnknownError, the connection moved
to the next member: the member may still apply it later, when it comes back, and every caller
resolves that by reading the key back and, only if the key is still at the version the write
expected, sending the same write again (bkaio/meta/conditional.py): both copies are
conditioned on that version, so at most one lands.

A member that failed a request is remembered for a cool-down (the URI's `retry_seconds`) by every
connection of the process (`MemberHealth`): a request or a watch opening (or re-opening) whose
current member failed within it goes to a member that has not (`choose_member`, for both), and a
failover passes over such members while one is left. Otherwise a
connection that was idle while a member went silent (the bookie's first-sight key lookups) would
learn it anew, one operation timeout per request, long after another connection had moved on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog
from aetcd import rpc

from bkaio.backoff import Backoff
from bkaio.errors import ConfigError, MetadataError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.uri import EtcdUri, shown_uri

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
MIN_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 1.0


def _never_sent(error: Any) -> bool:
    details = (error.details() or "").lower()
    return error.code() == rpc.StatusCode.UNAVAILABLE and any(
        marker in details for marker in _NOT_SENT_MARKERS
    )


def connection_lost(error: Any) -> bool:
    return error.code() in (rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED)


class MemberHealth:
    """When each etcd member (by address) last failed a request, shared by connections.

    A member that answers is forgotten; at most `max_members` failures are remembered (the
    oldest go first). `clock` is a monotonic clock in seconds (the same in every event loop).
    """

    def __init__(
        self, *, max_members: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert max_members > 0, max_members
        self._failed_at: OrderedDict[str, float] = OrderedDict()
        self._max_members = max_members
        self._clock = clock

    def failed(self, address: str) -> None:
        self._failed_at[address] = self._clock()
        self._failed_at.move_to_end(address)
        while len(self._failed_at) > self._max_members:
            self._failed_at.popitem(last=False)

    def answered(self, address: str) -> None:
        if self._failed_at:
            self._failed_at.pop(address, None)

    def failed_within(self, address: str, seconds: float) -> bool:
        failed_at = self._failed_at.get(address)
        return failed_at is not None and self._clock() - failed_at < seconds


# The connections of this process share what they learn about members.
PROCESS_MEMBER_HEALTH = MemberHealth()


class _Member:
    """The channel to one etcd member and its stubs."""

    def __init__(self, address: str, channel: Any) -> None:
        self.address = address
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)
        self.auth = rpc.AuthStub(channel)


class EtcdConnection:
    """The channels to the members of one etcd cluster, and the one way requests use them."""

    def __init__(self, uri: str, config: EtcdUri, health: MemberHealth | None = None) -> None:
        self.uri = uri
        self.config = config
        self.health = PROCESS_MEMBER_HEALTH if health is None else health
        self.members: list[_Member] = []
        self.current = 0  # Index into members of the member requests go to.
        # Open watch calls -> the member index they were opened on, to re-open them elsewhere.
        self.watch_calls: dict[Any, int] = {}
        self.moved_calls: set[Any] = set()  # Watch calls cancelled to move them elsewhere.
        self.metadata: tuple[tuple[str, str], ...] | None = None  # The login token, if any.
        self.closed = False

    @property
    def kv(self) -> Any:
        return self.members[self.current].kv

    @property
    def lease(self) -> Any:
        return self.members[self.current].lease

    @property
    def watch(self) -> Any:
        return self.members[self.current].watch

    async def connect(self) -> None:
        config = self.config
        credentials: Any = None
        # Present, not truthy: an empty file name is an error when read, never plain text.
        if config.ca_file is not None or config.cert_file is not None:
            import grpc  # type: ignore[import-untyped]  # Only the TLS path needs it.

            async def read(path: str | None) -> bytes | None:
                if path is None:
                    return None
                try:
                    # On a thread: the loop never waits on the disk (a slow or network mount).
                    return await asyncio.to_thread(Path(path).read_bytes)
                except OSError as error:
                    raise ConfigError(
                        f"metadata URI: cannot read TLS file {path}: {error}"
                    ) from None

            credentials = grpc.ssl_channel_credentials(
                root_certificates=await read(config.ca_file),
                private_key=await read(config.key_file),
                certificate_chain=await read(config.cert_file),
            )
        for host, port in config.endpoints:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if credentials is None:
                channel = rpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
            else:
                options = [*_CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", host)]
                channel = rpc.secure_channel(address, credentials, options=options)
            self.members.append(_Member(address, channel))
        if config.user is not None:
            await self.authenticate()

    def fail_over(self, used: int, code: Any) -> None:
        """Member `used` did not answer: send what follows to the next one (passing over members
        that failed within the cool-down while one has not), and move the watches open on it
        there too. No-op with one member, or when another request already moved on."""
        if len(self.members) == 1:
            return
        self.health.failed(self.members[used].address)  # Also when another request moved on.
        if self.current != used:
            return
        healthy = self._next_not_cooling(used)
        self._move(used, (used + 1) % len(self.members) if healthy is None else healthy, code.name)

    def choose_member(self) -> int:
        """The member the next attempt goes to: the current one, unless it failed within the
        cool-down and another has not (then the connection moves there first)."""
        used = self.current
        if len(self.members) > 1 and self._cooling(used):
            healthy = self._next_not_cooling(used)
            if healthy is not None:
                self._move(used, healthy, "FAILED_RECENTLY")
        return self.current

    def _next_not_cooling(self, used: int) -> int | None:
        """The first member after `used` (round robin) that has not failed within the
        cool-down, or None when every other one has."""
        for step in range(1, len(self.members)):
            index = (used + step) % len(self.members)
            if not self._cooling(index):
                return index
        return None

    def _cooling(self, index: int) -> bool:
        return self.health.failed_within(self.members[index].address, self.config.retry_seconds)

    def _move(self, used: int, to: int, reason: str) -> None:
        self.current = to
        log.warning(
            "etcd_member_failover", lost=self.members[used].address,
            now=self.members[to].address, code=reason,
        )  # fmt: skip
        for call, member in list(self.watch_calls.items()):
            if member == used:
                self.moved_calls.add(call)
                call.cancel()

    async def authenticate(self) -> None:
        request = rpc.AuthenticateRequest(name=self.config.user, password=self.config.password)

        async def call() -> Any:
            return await self.members[self.current].auth.Authenticate(
                request, timeout=self.config.operation_timeout_seconds
            )

        response = await self.retrying(
            "authenticate",
            call,
            idempotent=True,
            reauth=False,
            retry_seconds=self.config.connect_timeout_seconds,
        )
        self.metadata = (("token", response.token),)

    async def retrying(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        idempotent: bool,
        reauth: bool = True,
        retry_seconds: float | None = None,
    ) -> T:
        """`call()`, retried while etcd is unreachable for up to the URI's retry_seconds.

        An `idempotent` call's attempt that its member leaves unanswered is cut off and the call
        moves on to the next member: after the URI's attempt_timeout at first, then twice as
        long each time, up to the operation timeout (with one member, the operation timeout).
        Any other call's (a conditional write's) is cut off after the first attempt's bound
        too, and raises MetadataOutcomeUnknownError, the connection on the next member.
        With `retry_seconds` (first contact: connecting, logging in), that bound instead, and
        every attempt's bound is the members' share of it: a silent cluster is reported in time.
        """
        loop = asyncio.get_running_loop()
        budget = self.config.retry_seconds if retry_seconds is None else retry_seconds
        deadline = loop.time() + budget
        backoff = Backoff(MIN_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS)
        attempt_seconds = self._first_attempt_seconds(retry_seconds)
        while True:
            if self.closed:
                raise MetadataError(f"metadata store {shown_uri(self.uri)} is closed")
            used = self.choose_member()
            assert idempotent or retry_seconds is None, what  # First contact only reads.
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + attempt_seconds)):
                    result = await call()
            except TimeoutError:
                if not idempotent:  # It may still be applied: the caller reads the key back.
                    self.fail_over(used, rpc.StatusCode.DEADLINE_EXCEEDED)
                    raise MetadataOutcomeUnknownError(
                        f"etcd {what}: no answer from {self.members[used].address} within"
                        f" {attempt_seconds:g} s while the write was in flight; re-read the key"
                        " to learn the outcome"
                    ) from None
                if loop.time() < deadline - 0.01:
                    log.warning(
                        "etcd_retrying", operation=what, delay_seconds=0.0,
                        code="NO_ANSWER", member=self.members[used].address,
                        waited_seconds=round(attempt_seconds, 3),
                    )  # fmt: skip
                    self.fail_over(used, rpc.StatusCode.DEADLINE_EXCEEDED)
                    if retry_seconds is None:  # At first contact each member keeps its share.
                        attempt_seconds = min(
                            attempt_seconds * 2, self.config.operation_timeout_seconds
                        )
                    continue
                # Worded as the refused case below: which of the two ends the budget is chance.
                raise MetadataError(
                    f"etcd {what}: {self.endpoints_text()} unreachable for {budget} s:"
                    " no answer in time"
                ) from None
            except rpc.AioRpcError as error:
                code = error.code()
                if code == rpc.StatusCode.UNAUTHENTICATED and reauth and self.config.user:
                    reauth = False  # The token expired: log in again, once.
                    await self.authenticate()
                    continue
                if not connection_lost(error):
                    raise MetadataError(
                        f"etcd {what} failed: {code.name}: {error.details()}"
                    ) from None
                self.fail_over(used, code)
                if not idempotent and not _never_sent(error):
                    raise MetadataOutcomeUnknownError(
                        f"etcd {what}: connection lost while the write was in flight"
                        f" ({code.name}: {error.details()}); re-read the key to learn the outcome"
                    ) from None
                delay = backoff.next_delay()
                if loop.time() + delay > deadline:
                    raise MetadataError(
                        f"etcd {what}: {self.endpoints_text()} unreachable for"
                        f" {budget} s: {error.details()}"
                    ) from None
                log.warning(
                    "etcd_retrying", operation=what, delay_seconds=round(delay, 3), code=code.name
                )
                await asyncio.sleep(delay)
            else:
                if len(self.members) > 1:
                    self.health.answered(self.members[used].address)
                return result

    def _first_attempt_seconds(self, retry_seconds: float | None) -> float:
        """How long a call's first attempt waits for its member."""
        if retry_seconds is not None:
            return retry_seconds / len(self.members)
        if len(self.members) == 1:
            return self.config.operation_timeout_seconds  # No other member to move on to.
        return self.config.attempt_timeout_seconds

    def endpoints_text(self) -> str:
        return ",".join(f"{host}:{port}" for host, port in self.config.endpoints)

    async def close(self) -> None:
        """Fail every later request, and close the channels."""
        self.closed = True
        for member in self.members:
            with contextlib.suppress(Exception):
                await member.channel.close()
