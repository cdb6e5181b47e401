"""A member that failed a request is passed over by every connection of the process for a
cool-down (the URI's retry_seconds) while another member has not failed: a connection that was
idle when a member went silent (a bookie's first-sight key lookups) does not learn it anew by
waiting out an operation timeout, and neither does a watch it opens. Fake members record which
member each attempt went to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from aetcd import rpc

from bkaio.meta.etcd_connection import EtcdConnection, MemberHealth
from bkaio.meta.etcd_watch import watch_etcd_prefix
from bkaio.meta.uri import parse_etcd_uri

ADDRESSES = ("10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379")
URI = f"etcd://{','.join(ADDRESSES)}/bkaio?retry_seconds=30"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeKv:
    """A member's KV stub: answers, or fails as a silent (DEADLINE_EXCEEDED) or refusing one."""

    def __init__(self, address: str, tried: list[str], failing: dict[str, Any]) -> None:
        self.address = address
        self.tried = tried
        self.failing = failing

    async def Range(self, request: Any, *, timeout: float, metadata: Any) -> str:  # noqa: ASYNC109
        self.tried.append(self.address)
        code = self.failing.get(self.address)
        if code is not None:
            raise rpc.AioRpcError(code, details=f"fake {code.name}")
        return f"answer from {self.address}"


class FakeWatchCall:
    """A watch stream from one member: one put naming the member, then quiet until cancelled."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.cancelled = asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Any]:
        kv = SimpleNamespace(key=b"/bkaio/from", value=self.address.encode(), mod_revision=7)
        event = SimpleNamespace(type=rpc.Event.PUT, kv=kv)
        yield SimpleNamespace(compact_revision=0, canceled=False, events=[event])
        await self.cancelled.wait()
        raise asyncio.CancelledError


class FakeWatch:
    def __init__(self, address: str, tried: list[str]) -> None:
        self.address = address
        self.tried = tried

    def Watch(self, requests: AsyncIterator[Any], metadata: Any) -> FakeWatchCall:
        del requests, metadata
        self.tried.append(self.address)
        return FakeWatchCall(self.address)


class FakeMember:
    def __init__(self, address: str, tried: list[str], failing: dict[str, Any]) -> None:
        self.address = address
        self.kv = FakeKv(address, tried, failing)
        self.watch = FakeWatch(address, tried)


def _connection(health: MemberHealth, tried: list[str], failing: dict[str, Any]) -> EtcdConnection:
    connection = EtcdConnection(URI, parse_etcd_uri(URI), health)
    for address in ADDRESSES:
        connection.members.append(FakeMember(address, tried, failing))  # type: ignore[arg-type]
    return connection


async def _get(connection: EtcdConnection) -> Any:
    async def call() -> Any:
        return await connection.kv.Range(None, timeout=10.0, metadata=None)

    return await connection.retrying("get /ledgers/5", call, idempotent=True)


async def test_a_second_connection_skips_the_member_the_first_found_silent() -> None:
    health = MemberHealth(clock=FakeClock())
    tried: list[str] = []
    failing = {ADDRESSES[0]: rpc.StatusCode.DEADLINE_EXCEEDED}  # Member 0 is SIGSTOPped.
    main, lookups = _connection(health, tried, failing), _connection(health, tried, failing)

    assert await _get(main) == f"answer from {ADDRESSES[1]}"
    assert tried == [ADDRESSES[0], ADDRESSES[1]]

    tried.clear()  # The idle connection's first request goes straight to a member that answers.
    assert await _get(lookups) == f"answer from {ADDRESSES[1]}"
    assert tried == [ADDRESSES[1]]
    assert lookups.current == 1


async def test_a_failover_passes_over_a_member_that_failed_recently() -> None:
    health = MemberHealth(clock=FakeClock())
    tried: list[str] = []
    failing = {
        ADDRESSES[0]: rpc.StatusCode.DEADLINE_EXCEEDED,
        ADDRESSES[1]: rpc.StatusCode.DEADLINE_EXCEEDED,
    }
    connection = _connection(health, tried, failing)
    health.failed(ADDRESSES[1])  # Another connection of the process found member 1 silent.

    assert await _get(connection) == f"answer from {ADDRESSES[2]}"
    assert tried == [ADDRESSES[0], ADDRESSES[2]]


async def test_after_the_cool_down_or_an_answer_the_member_is_used_again() -> None:
    clock = FakeClock()
    health = MemberHealth(clock=clock)
    tried: list[str] = []
    failing = {ADDRESSES[0]: rpc.StatusCode.UNAVAILABLE}
    assert await _get(_connection(health, tried, failing)) == f"answer from {ADDRESSES[1]}"

    failing.clear()  # Member 0 is back; a fresh connection still avoids it for the cool-down.
    tried.clear()
    await _get(_connection(health, tried, failing))
    assert tried == [ADDRESSES[1]]

    clock.now += 30.0  # retry_seconds later it is tried first again, and its answer clears it.
    tried.clear()
    await _get(_connection(health, tried, failing))
    assert tried == [ADDRESSES[0]]
    assert not health.failed_within(ADDRESSES[0], 3600)


async def test_with_every_member_failed_recently_the_connection_keeps_its_order() -> None:
    health = MemberHealth(clock=FakeClock())
    tried: list[str] = []
    for address in ADDRESSES:
        health.failed(address)
    failing = {ADDRESSES[0]: rpc.StatusCode.UNAVAILABLE}

    assert await _get(_connection(health, tried, failing)) == f"answer from {ADDRESSES[1]}"
    assert tried == [ADDRESSES[0], ADDRESSES[1]]


def test_the_remembered_failures_are_bounded() -> None:
    health = MemberHealth(max_members=2, clock=FakeClock())
    for address in ADDRESSES:
        health.failed(address)
    assert [health.failed_within(address, 60) for address in ADDRESSES] == [False, True, True]


async def test_a_watch_opened_after_a_member_failed_opens_on_another() -> None:
    health = MemberHealth(clock=FakeClock())
    tried: list[str] = []
    connection = _connection(health, tried, {})
    health.failed(ADDRESSES[0])  # Another connection of the process found member 0 silent.

    async def no_revision() -> int:
        raise AssertionError("start_revision is given")

    events = watch_etcd_prefix(
        connection, "/bkaio", "/", start_revision=7, current_revision=no_revision
    )
    try:
        event = await asyncio.wait_for(anext(events), 5)
    finally:
        await events.aclose()
    assert event.value == ADDRESSES[1].encode()
    assert tried == [ADDRESSES[1]]
    assert connection.current == 1
