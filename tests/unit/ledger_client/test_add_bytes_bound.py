"""The bytes bound of a writer's appends (ClientConfig.max_outstanding_add_bytes): the adds
in flight were bounded by count only, so 10 000 entries of 8 MiB (80 GB) could be in flight.
An append that would take the payload bytes in flight past the bound is queued until
acknowledgements free room; one entry larger than the bound goes alone, so it never stalls."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bkaio.errors import ConfigError
from bkaio.ledger_client import ClientConfig, LedgerHandle
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster

BOUND = 100


def recording_sends(cluster: FakeCluster) -> list[int]:
    """The entry ids sent, once per bookie asked (in order)."""
    sent: list[int] = []
    add_entry = cluster.ops.add_entry

    def recorded(bookie_id: str, ledger_id: int, entry_id: int, **kwargs: Any) -> None:
        sent.append(entry_id)
        add_entry(bookie_id, ledger_id, entry_id, **kwargs)

    cluster.ops.add_entry = recorded  # type: ignore[method-assign]
    return sent


async def striped_and_held(cluster: FakeCluster) -> tuple[LedgerHandle, list[str]]:
    """A ledger whose entries go to one bookie each, alternately (E=2, Qw=Qa=1), both bookies
    holding their answers until released."""
    lh = await cluster.client.create_ledger(2, 1, 1)
    ensemble = list(lh.metadata.ensembles[0][1])
    for bookie_id in ensemble:
        cluster.ops.hold(bookie_id)
    return lh, ensemble


async def test_appends_wait_at_the_bytes_bound_and_go_as_acks_free_bytes() -> None:
    cluster = fake_cluster(2, max_outstanding_add_bytes=BOUND)
    sent = recording_sends(cluster)
    lh, (first, _) = await striped_and_held(cluster)
    futures = [lh.append(b"%02d" % i * 20) for i in range(5)]  # 40 bytes each.
    assert sent == [0, 1]  # 80 bytes in flight; a third would make 120.
    waiter = asyncio.ensure_future(lh.wait_for_capacity())
    await asyncio.sleep(0)
    assert not waiter.done()
    # Entry 0 acknowledged: 40 bytes freed, entry 2 goes (80 in flight), entry 3 would not fit.
    cluster.ops.release(first)
    cluster.ops.hold(first)
    assert await futures[0] == 0
    assert sent == [0, 1, 2]
    assert not waiter.done()
    for bookie_id in lh.metadata.ensembles[0][1]:
        cluster.ops.release(bookie_id)
    assert await asyncio.gather(*futures) == list(range(5))
    await waiter
    assert sent == list(range(5))
    assert lh.length == 5 * 40
    await lh.close()


async def test_wait_for_capacity_waits_while_the_bytes_in_flight_fill_the_bound() -> None:
    cluster = fake_cluster(2, max_outstanding_add_bytes=BOUND)
    lh, ensemble = await striped_and_held(cluster)
    futures = [lh.append(b"y" * 50), lh.append(b"z" * 50)]  # Both sent: 100 bytes in flight.
    waiter = asyncio.ensure_future(lh.wait_for_capacity())
    await asyncio.sleep(0)
    assert not waiter.done()  # Nothing queued, but not a byte more would be sent.
    for bookie_id in ensemble:
        cluster.ops.release(bookie_id)
    await waiter
    assert await asyncio.gather(*futures) == [0, 1]
    await lh.close()


async def test_an_entry_larger_than_the_bound_goes_alone() -> None:
    cluster = fake_cluster(2, max_outstanding_add_bytes=BOUND)
    sent = recording_sends(cluster)
    lh, ensemble = await striped_and_held(cluster)
    huge = lh.append(b"h" * (3 * BOUND))
    assert sent == [0]  # Nothing else in flight: it goes at once.
    small = lh.append(b"s")
    assert sent == [0]  # Behind it until it is acknowledged.
    cluster.ops.release(ensemble[0])
    assert await huge == 0
    assert sent == [0, 1]
    cluster.ops.release(ensemble[1])
    assert await small == 1
    # And one queued behind others goes once they are acknowledged.
    small = lh.append(b"s")  # Entry 2: to the first bookie, not held any more.
    huge = lh.append(b"h" * (3 * BOUND))  # Entry 3: queued behind entry 2.
    assert sent == [0, 1, 2]
    assert await small == 2
    assert await huge == 3
    assert sent == [0, 1, 2, 3]
    await lh.close()


@pytest.mark.parametrize("value", [0, -1, 2.5, "64MiB", True])
def test_a_bad_bytes_bound_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match=f"max_outstanding_add_bytes={value!r} must be"):
        ClientConfig(max_outstanding_add_bytes=value)  # type: ignore[arg-type]
