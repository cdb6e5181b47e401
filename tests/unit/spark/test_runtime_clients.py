"""The connector runtime's client cache is bounded: a Python worker lives across queries, and one
whose queries bring ever new `bkaio.client.*` options (a token renewed per job) kept a client,
with its bookie connections and background tasks, for every set it had seen. It now keeps the
`MAX_CLIENTS` used last and closes an evicted one once no call uses it any more."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta import initialise_cluster_at
from bkaio.spark.runtime import MAX_CLIENTS, ClientLease, Runtime


@pytest.fixture
def uri(tmp_path: Path) -> str:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    asyncio.run(initialise_cluster_at(uri))
    return uri


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[BookKeeper]:
    """Every client closed, in order."""
    closed: list[BookKeeper] = []
    real_close = BookKeeper.close

    async def recording_close(self: BookKeeper) -> None:
        closed.append(self)
        await real_close(self)

    monkeypatch.setattr(BookKeeper, "close", recording_close)
    return closed


def options(i: int) -> dict[str, Any]:
    return {"read_timeout": 1.0 + i}  # A distinct set of client options per query.


def one_use(runtime: Runtime, uri: str, i: int) -> BookKeeper:
    async def use() -> BookKeeper:
        async with runtime.client(uri, options(i)) as bk:
            return bk

    return runtime.run(use())


def test_at_most_max_clients_are_kept_and_the_least_recently_used_is_closed(
    runtime: Runtime, uri: str, closed: list[BookKeeper]
) -> None:
    clients = [one_use(runtime, uri, i) for i in range(MAX_CLIENTS)]
    assert one_use(runtime, uri, 0) is clients[0]  # Reused, and now the most recently used.
    assert closed == []
    newer = one_use(runtime, uri, MAX_CLIENTS)
    assert closed == [clients[1]]  # The one used longest ago.
    assert one_use(runtime, uri, 0) is clients[0]
    assert one_use(runtime, uri, MAX_CLIENTS) is newer
    for i in range(MAX_CLIENTS + 1, 3 * MAX_CLIENTS):
        one_use(runtime, uri, i)
    assert len(closed) == 3 * MAX_CLIENTS - MAX_CLIENTS  # Never more than MAX_CLIENTS open.
    assert len(set(map(id, closed))) == len(closed)


def test_an_evicted_client_in_use_is_closed_by_its_last_release(
    runtime: Runtime, uri: str, closed: list[BookKeeper]
) -> None:
    lease: ClientLease = runtime.run(runtime.lease(uri, options(0)))  # A sink task's.
    for i in range(1, MAX_CLIENTS + 2):
        one_use(runtime, uri, i)
    assert lease.bk not in closed  # Evicted, but the task still writes with it.
    runtime.run(runtime.release(lease))
    assert closed[-1] is lease.bk
