"""The etcd driver counts a granted lease's TTL from when it sent the grant (d3d2edd): etcd
starts the TTL when it grants, which may be long before the answer reaches the holder (a slow
reply, a stalled loop). A fake connection stands in for etcd's LeaseGrant; the simulator's
loop makes the slow answer take virtual time only."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from bkaio.meta.etcd_driver import EtcdMetadataStore
from bkaio.meta.uri import parse_etcd_uri
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop

T = TypeVar("T")
URI = "etcd://127.0.0.1:2379/test"


@dataclass(frozen=True, slots=True)
class FakeLeaseGrantResponse:
    ID: int
    TTL: int
    error: str = ""


class FakeLeaseStub:
    """etcd's lease service: grants the TTL asked for at once, and its answer then takes
    `answer_seconds` to come back."""

    def __init__(self, answer_seconds: float) -> None:
        self.answer_seconds = answer_seconds
        self.granted_at: list[float] = []

    async def LeaseGrant(  # The gRPC stub's name.
        self, request: Any, **options: Any
    ) -> FakeLeaseGrantResponse:
        del options  # timeout, metadata
        self.granted_at.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.answer_seconds)
        return FakeLeaseGrantResponse(ID=41, TTL=int(request.TTL))


class FakeEtcdConnection:
    """What `EtcdMetadataStore.grant_lease` uses of `EtcdConnection`: `lease`, `metadata` and
    `retrying` (one attempt, answered)."""

    def __init__(self, answer_seconds: float) -> None:
        self.lease = FakeLeaseStub(answer_seconds)
        self.metadata = None

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]], *, idempotent: bool) -> T:
        del what, idempotent
        return await call()


def _grant(answer_seconds: float, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, bool, float]:
    """A 1 s lease granted through the fake: (in doubt, lost) when the holder gets it, and
    how long after etcd granted it the holder got it."""

    async def main() -> tuple[bool, bool, float]:
        store = EtcdMetadataStore(URI, parse_etcd_uri(URI))
        connection = FakeEtcdConnection(answer_seconds)
        monkeypatch.setattr(store, "_connection", connection)
        lease = await store.grant_lease(1.0)
        late = asyncio.get_running_loop().time() - connection.lease.granted_at[0]
        return lease.in_doubt, lease.lost, late

    loop = SimLoop(random.Random(0))
    try:
        with sealed():
            return loop.run_until_complete(main())
    finally:
        loop.close()


def test_etcd_a_grant_answered_after_its_ttl_is_in_doubt_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_doubt, lost, late = _grant(1.5, monkeypatch)
    assert late >= 1.5  # etcd has dropped the lease by the time the holder has it...
    assert in_doubt and not lost  # ...so the holder must not count on it.


def test_etcd_a_grant_answered_at_once_is_not_in_doubt(monkeypatch: pytest.MonkeyPatch) -> None:
    in_doubt, lost, _ = _grant(0.0, monkeypatch)
    assert not in_doubt and not lost
