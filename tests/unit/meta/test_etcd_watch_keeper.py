"""An etcd watch re-opens rather than fail for good: when its keeper (its silence detection) hits
a bug, the bug is reported and the watch re-opens with a fresh keeper (without one it would stall
on a member that stopped sending); when its stream breaks mid-way, it re-opens after the last
revision it delivered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aetcd import rpc
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from bkaio.meta import etcd_watch
from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.store import EventKind
from bkaio.supervision import Supervisor


class FakeCall:
    """A watch call: its responses, then silence until cancelled (a member that stopped
    sending keeps its connection open), or then `error` when one is given."""

    def __init__(self, responses: list[Any], error: BaseException | None = None) -> None:
        self._responses = responses
        self._error = error
        self._cancelled = asyncio.Event()

    def cancel(self) -> bool:
        self._cancelled.set()
        return True

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[Any]:
        for response in self._responses:
            yield response
        if self._error is not None:
            raise self._error
        await self._cancelled.wait()
        raise asyncio.CancelledError


class FakeWatchStub:
    def __init__(self, calls: list[FakeCall]) -> None:
        self._calls = calls

    def Watch(self, requests: AsyncIterator[Any], metadata: Any) -> FakeCall:
        del requests, metadata
        return self._calls.pop(0)


class BuggyConnection:
    """One member; its fail_over (which the keeper calls on silence) hits a bug."""

    def __init__(self, watch: FakeWatchStub) -> None:
        self.watch = watch
        self.current = 0
        self.metadata = None
        self.closed = False
        self.watch_calls: dict[Any, int] = {}
        self.moved_calls: set[Any] = set()

    def choose_member(self) -> int:
        return self.current

    def fail_over(self, used: int, code: Any) -> None:
        raise RuntimeError("bug in fail_over")


def _put(key: str, revision: int) -> Any:
    kv = SimpleNamespace(key=key.encode(), value=b"v", mod_revision=revision)
    event = SimpleNamespace(type=rpc.Event.PUT, kv=kv)
    return SimpleNamespace(compact_revision=0, canceled=False, events=[event])


async def _no_revision() -> int:
    raise AssertionError("start_revision is given")


async def test_a_keeper_that_raises_is_reported_and_the_watch_reopens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(etcd_watch, "WATCH_IDLE_SECONDS", 0.01)
    registry = CollectorRegistry()
    supervisor = Supervisor("bookie", registry=registry)
    supervisor.adopt_loop()
    # The first call delivers one event then goes silent: its keeper's fail_over raises.
    watch = FakeWatchStub([FakeCall([_put("/r/a", 5)]), FakeCall([_put("/r/b", 6)])])
    connection = cast(EtcdConnection, BuggyConnection(watch))
    events = etcd_watch.watch_etcd_prefix(
        connection, "/r", "/", start_revision=5, current_revision=_no_revision
    )
    try:
        with capture_logs() as logs:
            first = await asyncio.wait_for(anext(events), 5)
            second = await asyncio.wait_for(anext(events), 5)  # From the re-opened watch.
    finally:
        await events.aclose()
        await supervisor.stop()
    assert (first.key, first.revision) == ("/a", 5)
    assert (second.key, second.revision, second.kind) == ("/b", 6, EventKind.PUT)
    (failed,) = [e for e in logs if e["event"] == "task_failed"]
    assert failed["task"] == "etcd_watch_keeper" and failed["log_level"] == "error"
    failures = registry.get_sample_value("bkaio_task_failures_total", {"task": "etcd_watch_keeper"})
    assert failures == 1


class OneMemberConnection(BuggyConnection):
    """One member whose fail_over has nothing to move to, as EtcdConnection's with one member."""

    def fail_over(self, used: int, code: Any) -> None:
        pass


@pytest.mark.parametrize("code", [rpc.StatusCode.INTERNAL, rpc.StatusCode.UNKNOWN])
async def test_a_stream_broken_mid_way_reopens_after_the_last_revision(code: Any) -> None:
    broken = rpc.AioRpcError(code, details="Internal error from Core")
    watch = FakeWatchStub([FakeCall([_put("/r/a", 5)], broken), FakeCall([_put("/r/b", 6)])])
    connection = cast(EtcdConnection, OneMemberConnection(watch))
    events = etcd_watch.watch_etcd_prefix(
        connection, "/r", "/", start_revision=5, current_revision=_no_revision
    )
    try:
        with capture_logs() as logs:
            first = await asyncio.wait_for(anext(events), 5)
            second = await asyncio.wait_for(anext(events), 5)
    finally:
        await events.aclose()
    assert (first.revision, second.revision) == (5, 6)
    (reconnecting,) = [e for e in logs if e["event"] == "etcd_watch_reconnecting"]
    assert reconnecting["code"] == code.name and reconnecting["from_revision"] == 6
