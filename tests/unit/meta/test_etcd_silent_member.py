"""A request that may be repeated leaves a silent etcd member after the URI's attempt_timeout
and completes on the next member, instead of waiting out the whole operation timeout (a
process's first request to a member SIGSTOPped, partitioned or with a hung disk, which no failure
on record lets it skip). Each later attempt waits twice as long, so a slow member still answers.
A conditional write is cut off after the same first attempt and ends as
MetadataOutcomeUnknownError, the connection on the next member, where the caller's read-back
goes (it used to wait out the whole operation timeout).

Fake members stand in for etcd's KV service: a silent one answers nothing until gRPC's own
deadline (the timeout the driver passes) ends the call with DEADLINE_EXCEEDED. The log says how
each call ended. The simulator's loop makes every wait virtual time."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from aetcd import rpc

from bkaio.errors import ConfigError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.etcd_connection import EtcdConnection, MemberHealth
from bkaio.meta.etcd_driver import EtcdMetadataStore
from bkaio.meta.uri import parse_etcd_uri
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop

T = TypeVar("T")
ADDRESSES = ("10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379")
URI = f"etcd://{','.join(ADDRESSES)}/bkaio"  # timeout 10 s, attempt_timeout 2 s: the defaults.
SILENT = float("inf")


class FakeKv:
    """A member's KV stub: answers after `answer_seconds` (SILENT: never, so gRPC's deadline
    ends the call), and logs (address, how the call ended, virtual time it ended)."""

    def __init__(self, address: str, answer_seconds: float, log: list[tuple[str, str, float]]):
        self.address = address
        self.answer_seconds = answer_seconds
        self.log = log

    async def Range(self, request: Any, *, timeout: float, metadata: Any) -> Any:  # noqa: ASYNC109
        del request, metadata
        await self._answer(timeout)
        kv = SimpleNamespace(
            key=b"/bkaio/ledgers/5", value=self.address.encode(), mod_revision=3,
            create_revision=3, lease=0,
        )  # fmt: skip
        return SimpleNamespace(kvs=[kv])

    async def Txn(self, request: Any, *, timeout: float, metadata: Any) -> Any:  # noqa: ASYNC109
        del request, metadata
        await self._answer(timeout)
        return SimpleNamespace(succeeded=True, header=SimpleNamespace(revision=4))

    async def _answer(self, grpc_deadline_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(min(self.answer_seconds, grpc_deadline_seconds))
        except asyncio.CancelledError:
            self.log.append((self.address, "abandoned", loop.time()))
            raise
        if self.answer_seconds > grpc_deadline_seconds:
            self.log.append((self.address, "deadline exceeded", loop.time()))
            raise rpc.AioRpcError(rpc.StatusCode.DEADLINE_EXCEEDED, details="Deadline Exceeded")
        self.log.append((self.address, "answered", loop.time()))


def _store(
    uri: str, answer_seconds: tuple[float, ...], log: list[tuple[str, str, float]]
) -> EtcdMetadataStore:
    """A store whose connection talks to fake members (its own member health, clean)."""
    store = EtcdMetadataStore(uri, parse_etcd_uri(uri))
    connection = EtcdConnection(uri, store._config, MemberHealth())
    for address, seconds in zip(ADDRESSES, answer_seconds, strict=False):
        member = SimpleNamespace(address=address, kv=FakeKv(address, seconds, log))
        connection.members.append(member)  # type: ignore[arg-type]
    store._connection = connection
    return store


def _run(main: Coroutine[Any, Any, T]) -> T:
    loop = SimLoop(random.Random(0))
    try:
        with sealed():
            return loop.run_until_complete(main)
    finally:
        loop.close()


def test_a_read_leaves_a_silent_member_and_completes_on_the_next() -> None:
    log: list[tuple[str, str, float]] = []

    async def main() -> tuple[bytes | None, float]:
        store = _store(URI, (SILENT, 0.01, 0.01), log)
        started = asyncio.get_running_loop().time()
        kv = await store.get("/ledgers/5")
        return (None if kv is None else kv.value), started

    value, started = _run(main())
    assert value == ADDRESSES[1].encode()
    # Member 0 was left (not ended by its own 10 s deadline), and member 1 answered.
    assert [(address, outcome) for address, outcome, _ in log] == [
        (ADDRESSES[0], "abandoned"),
        (ADDRESSES[1], "answered"),
    ]
    # On the simulated clock: member 0 was given the attempt timeout, not the operation's.
    assert log[0][2] - started == pytest.approx(2.0, abs=0.01)


def test_each_later_attempt_waits_twice_as_long_so_a_slow_member_answers() -> None:
    log: list[tuple[str, str, float]] = []

    async def main() -> bytes | None:
        store = _store(URI, (6.0, 6.0, 6.0), log)  # Alive, every member slow.
        kv = await store.get("/ledgers/5")
        return None if kv is None else kv.value

    assert _run(main()) == ADDRESSES[2].encode()
    assert [(address, outcome) for address, outcome, _ in log] == [
        (ADDRESSES[0], "abandoned"),  # After 2 s.
        (ADDRESSES[1], "abandoned"),  # After 4 s.
        (ADDRESSES[2], "answered"),  # Given 8 s.
    ]


def test_with_one_member_a_read_waits_the_whole_operation_timeout() -> None:
    log: list[tuple[str, str, float]] = []
    uri = f"etcd://{ADDRESSES[0]}/bkaio"

    async def main() -> bytes | None:
        kv = await _store(uri, (6.0,), log).get("/ledgers/5")
        return None if kv is None else kv.value

    assert _run(main()) == ADDRESSES[0].encode()
    assert [(address, outcome) for address, outcome, _ in log] == [(ADDRESSES[0], "answered")]


def test_a_conditional_write_leaves_a_silent_member_as_an_unknown_outcome() -> None:
    log: list[tuple[str, str, float]] = []

    async def main() -> bytes | None:
        store = _store(URI, (SILENT, 0.01, 0.01), log)
        with pytest.raises(MetadataOutcomeUnknownError, match=f"no answer from {ADDRESSES[0]}"):
            await store.compare_and_swap("/ledgers/5", b"x", expected_version=3)
        kv = await store.get("/ledgers/5")  # The caller's read-back.
        return None if kv is None else kv.value

    # Cut off (not ended by its own 10 s deadline) and not sent again elsewhere: its outcome
    # is the caller's to learn, and the read doing so goes to the next member.
    assert _run(main()) == ADDRESSES[1].encode()
    assert [(address, outcome) for address, outcome, _ in log] == [
        (ADDRESSES[0], "abandoned"),
        (ADDRESSES[1], "answered"),
    ]


def test_a_versioned_delete_leaves_a_silent_member_as_an_unknown_outcome() -> None:
    log: list[tuple[str, str, float]] = []

    async def main() -> None:
        await _store(URI, (SILENT, 0.01, 0.01), log).delete("/ledgers/5", expected_version=3)

    with pytest.raises(MetadataOutcomeUnknownError, match=f"no answer from {ADDRESSES[0]}"):
        _run(main())
    assert [(address, outcome) for address, outcome, _ in log] == [(ADDRESSES[0], "abandoned")]


def test_the_attempt_timeout_is_a_uri_option_at_most_the_timeout() -> None:
    assert parse_etcd_uri(URI).attempt_timeout_seconds == 2.0
    assert parse_etcd_uri(f"{URI}?attempt_timeout=0.5").attempt_timeout_seconds == 0.5
    assert parse_etcd_uri(f"{URI}?timeout=1").attempt_timeout_seconds == 1.0  # Default capped.
    with pytest.raises(ConfigError, match=r"attempt_timeout='12' must not exceed timeout \(10 s\)"):
        parse_etcd_uri(f"{URI}?attempt_timeout=12")
    with pytest.raises(ConfigError, match="attempt_timeout='0' must be a finite number"):
        parse_etcd_uri(f"{URI}?attempt_timeout=0")
