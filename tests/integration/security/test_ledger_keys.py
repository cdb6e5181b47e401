"""Ledger authorization on real bookies: first-sight keys are checked against metadata."""

from __future__ import annotations

import asyncio
import urllib.request

import bkaio
from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.messages import (
    AddEntryRequest,
    Flag,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    WriteLacRequest,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.integration.bookie.raw_client import RawClient, add_request


def _metrics(cluster: BookieCluster) -> str:
    with urllib.request.urlopen(f"{cluster[0].admin_url}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exported")


async def test_nobody_can_squat_or_fence_a_ledger_by_guessing_its_id(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory()
    async with bkaio.BookKeeper.connect(cluster.metadata_uri) as bk:
        handle = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"real"
        )
        ledger_id = handle.ledger_id
        attacker = await RawClient.connect(cluster[0].host, cluster[0].port)
        guessed = master_key(b"guess", ledger_id)
        # Squat: the attacker's adds race the writer's first add, with a key of its own.
        squats = [
            add_request(attacker.next_id(), ledger_id, entry_id, b"evil", key=guessed)
            for entry_id in range(20)
        ]
        for request in squats:
            attacker.send(request)
        written = await asyncio.gather(*(handle.append(f"ok-{i}".encode()) for i in range(20)))
        assert written == list(range(20))
        answers = [await attacker.read_response() for _ in squats]
        assert {a.status for a in answers} == {Status.UNAUTHORIZED}
        # Fence with a wrong key: refused, and the writer goes on.
        fence = ReadLacRequest(attacker.next_id(), ledger_id, Flag.FENCE, guessed, -1, 0)
        assert (await attacker.request(fence)).status is Status.UNAUTHORIZED
        fence_read = ReadEntryRequest(attacker.next_id(), ledger_id, 0, Flag.FENCE, guessed)
        assert (await attacker.request(fence_read)).status is Status.UNAUTHORIZED
        lac = WriteLacRequest(attacker.next_id(), ledger_id, guessed, 10**6)
        assert (await attacker.request(lac)).status is Status.UNAUTHORIZED
        assert await handle.append(b"still-writable") == 20
        # A ledger id nobody created yet (the next one a writer would get): refused too.
        future_id = ledger_id + 1
        ahead = add_request(
            attacker.next_id(), future_id, 0, b"x", key=master_key(b"real", future_id)
        )
        assert (await attacker.request(ahead)).status is Status.UNAUTHORIZED
        fence_ahead = ReadLacRequest(
            attacker.next_id(), future_id, Flag.FENCE, master_key(b"guess", future_id), -1, 0
        )
        assert (await attacker.request(fence_ahead)).status is Status.UNAUTHORIZED
        await handle.close()
        await attacker.close()
        # A later ledger with the same password works: nothing was squatted.
        second = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"real"
        )
        assert await second.append(b"fine") == 0
        await second.close()
    text = _metrics(cluster)
    assert _value(text, 'bkaio_bookie_ledger_key_checks_total{result="wrong_key"}') >= 2
    assert _value(text, 'bkaio_bookie_ledger_key_checks_total{result="no_metadata"}') >= 2
    assert _value(text, 'bkaio_bookie_ledger_key_checks_total{result="accepted"}') >= 2


async def test_a_stored_entry_takes_only_identical_re_adds(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory()
    async with bkaio.BookKeeper.connect(cluster.metadata_uri) as bk:
        handle = await bk.create_ledger(
            ensemble_size=1, write_quorum=1, ack_quorum=1, password=b"pw"
        )
        await handle.append(b"agreed-0")
        await handle.append(b"agreed-1")
        ledger_id = handle.ledger_id
        key = master_key(b"pw", ledger_id)
        client = await RawClient.connect(cluster[0].host, cluster[0].port)
        stored = await client.request(
            ReadEntryRequest(client.next_id(), ledger_id, 0, Flag.NONE, None)
        )
        assert isinstance(stored, ReadEntryResponse) and stored.entry is not None
        entry = stored.entry

        def add(payload: bytes, flags: Flag) -> AddEntryRequest:
            digest = entry_digest(ledger_id, 0, entry.lac, entry.length, payload)
            return AddEntryRequest(
                client.next_id(), ledger_id, 0, flags, key, entry.lac, entry.length, digest, payload
            )

        # A client retry or a recovery write-back of the same bytes succeeds.
        assert (await client.request(add(entry.payload, Flag.NONE))).status is Status.OK
        assert (await client.request(add(entry.payload, Flag.RECOVERY_ADD))).status is Status.OK
        # Other bytes under the same id are refused, even with the right key and a valid digest.
        for flags in (Flag.NONE, Flag.RECOVERY_ADD):
            response = await client.request(add(b"rewritten", flags))
            assert response.status is Status.ENTRY_CONFLICT
        await client.close()
        reader = await bk.open_ledger(ledger_id, password=b"pw", recovery=True)
        assert [e.payload for e in await reader.read(0, 1)] == [b"agreed-0", b"agreed-1"]
