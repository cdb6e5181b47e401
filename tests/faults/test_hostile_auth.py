"""Hostile clients against a live bookie: authentication and ledger keys (docs/security.md).

What tests/faults/test_hostile_clients.py leaves out: every kind of write, fence and long poll
sent before HELLO or pipelined behind a refused HELLO; ADD_ENTRIES frames with a wrong key; a
fence flag on READ_ENTRIES; and forged LACs (a wrong-key WRITE_LAC or add) reaching waiting long
polls. The bookie, its canary and the checks after each case are that module's (this module
starts a bookie of its own).
"""

from __future__ import annotations

from typing import Any

from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    AddEntriesRequest,
    Flag,
    HelloRequest,
    Op,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadEntryRequest,
    ReadLacRequest,
    ReadLacResponse,
    Request,
    WireEntry,
    WriteLacRequest,
)
from bkaio.protocol.status import Status
from tests.faults.test_hostile_clients import (
    Guard,
    _add,
    _connect,
    _new_ledger,
    _read_status,
)
from tests.faults.test_hostile_clients import bookie as bookie  # The fixtures, re-exported.
from tests.faults.test_hostile_clients import guard as guard

FAR = 10**5  # Entry ids no canary reaches.


def _adds(request_id: int, ledger_id: int, first: int, count: int, key: bytes) -> AddEntriesRequest:
    entries = []
    for entry_id in range(first, first + count):
        payload = f"hostile-{entry_id}".encode()
        lac, length = 10**6, 100 * (entry_id + 1)  # A piggybacked LAC far ahead.
        digest = entry_digest(ledger_id, entry_id, lac, length, payload)
        entries.append(WireEntry(entry_id, lac, length, digest, payload))
    return AddEntriesRequest(request_id, ledger_id, Flag.NONE, key, tuple(entries))


def _writes(ledger_id: int, key: bytes) -> list[Request]:
    """Every request that changes a ledger (adds, a frame of adds, WRITE_LAC, fencing reads),
    and long polls, with request ids from 1."""
    return [
        _add(1, ledger_id, FAR, b"early", key),
        _add(2, ledger_id, FAR + 1, b"early", key, flags=Flag.RECOVERY_ADD),
        _adds(3, ledger_id, FAR + 2, 3, key),
        WriteLacRequest(6, ledger_id, key, 10**6),
        ReadEntryRequest(7, ledger_id, 0, Flag.FENCE, key),
        ReadLacRequest(8, ledger_id, Flag.FENCE, key, -1, 0),
        ReadLacRequest(9, ledger_id, Flag.LONG_POLL, None, 10**6, 1000),
        ReadEntriesRequest(10, ledger_id, 0, 10, 1, 10, 10**4, Flag.LONG_POLL, 10**6, 1000),
    ]


async def _untouched(guard: Guard, ledger_id: int) -> None:
    """Nothing of `_writes` was applied: no entry stored, no LAC raised (the canary keeps
    adding after the case, which it could not on a fenced ledger)."""
    checker = await _connect(guard.cluster)
    for entry_id in range(FAR, FAR + 5):
        assert await _read_status(checker, ledger_id, entry_id) is Status.NO_SUCH_ENTRY
    lac = await checker.request(
        ReadLacRequest(checker.next_id(), ledger_id, Flag.NONE, None, -1, 0)
    )
    assert isinstance(lac, ReadLacResponse) and lac.lac < FAR, lac
    await checker.close()


async def test_nothing_but_hello_is_executed_before_hello(guard: Guard) -> None:
    ledger_id, key = guard.canary.ledger_id, guard.canary.key
    for request in _writes(ledger_id, key):
        client = await _connect(guard.cluster, hello=False)
        answer = await client.request(request)
        assert answer.status is Status.BAD_REQUEST, (request.op, answer)
        assert await client.closed_by_peer()
        assert client.pending == []
        await client.close()
    await _untouched(guard, ledger_id)


async def test_nothing_behind_a_refused_hello_is_executed(guard: Guard) -> None:
    ledger_id, key = guard.canary.ledger_id, guard.canary.key
    for token in (None, "guess"):
        client = await _connect(guard.cluster, hello=False)
        client.send(HelloRequest(100, PROTOCOL_VERSION, "guesser", token))
        for request in _writes(ledger_id, key):  # In the same segment as the HELLO, or after.
            client.send(request)
        response = await client.read_response()
        assert response.status is Status.UNAUTHORIZED and response.request_id == 100
        assert await client.closed_by_peer()
        assert client.pending == []
        await client.close()
    await _untouched(guard, ledger_id)


async def test_an_add_entries_frame_with_a_wrong_key_stores_nothing(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    # A ledger whose key the bookie holds (the canary's), and one it has not seen yet.
    fresh_id, fresh_key = await _new_ledger(guard.cluster)
    for ledger_id in (guard.canary.ledger_id, fresh_id):
        frame = _adds(client.next_id(), ledger_id, FAR, 4, master_key(b"guess", ledger_id))
        for _ in range(3):
            client.next_id()  # The frame's adds take ids request_id .. request_id + 3.
        client.send(frame)
        answers = [await client.read_response() for _ in range(4)]
        assert [a.request_id for a in answers] == [frame.request_id + i for i in range(4)]
        assert {a.status for a in answers} == {Status.UNAUTHORIZED}, answers
    await _untouched(guard, guard.canary.ledger_id)
    # Not even created by the guess.
    assert await _read_status(client, fresh_id, FAR) is Status.NO_SUCH_LEDGER
    # The guess did not squat the fresh ledger: its writer's key works.
    add = _add(client.next_id(), fresh_id, 0, b"mine", fresh_key)
    assert (await client.request(add)).status is Status.OK
    await client.close()


async def test_read_entries_takes_no_fence_flag(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    ledger_id = guard.canary.ledger_id
    fence = int(Flag.FENCE)
    body: list[Any] = [int(Op.READ_ENTRIES), 5, ledger_id, 0, 0, 1, 1, 1000, fence, -1, 0]
    answer = await client.request(body)
    assert answer.status is Status.BAD_REQUEST and answer.request_id == 5
    assert await client.closed_by_peer()
    await client.close()  # The canary adding after this shows the ledger was not fenced.


async def test_a_forged_lac_wakes_no_long_poll(guard: Guard) -> None:
    """A WRITE_LAC or adds with a wrong key and a LAC far ahead: refused, and the long polls
    waiting on the ledger go on waiting until its writer moves the LAC."""
    ledger_id, key = await _new_ledger(guard.cluster)
    writer = await _connect(guard.cluster)
    assert (await writer.request(_add(writer.next_id(), ledger_id, 0, b"e0", key))).status is (
        Status.OK
    )
    poller = await _connect(guard.cluster)
    lac_poll = ReadLacRequest(50, ledger_id, Flag.LONG_POLL, None, -1, 30_000)
    entries_poll = ReadEntriesRequest(
        51, ledger_id, 0, 10, 1, 10, 10**4, Flag.LONG_POLL, -1, 30_000
    )
    poller.send(lac_poll)
    poller.send(entries_poll)
    await poller.writer.drain()
    wrong = master_key(b"guess", ledger_id)
    attacker = await _connect(guard.cluster)
    forged_lac = WriteLacRequest(attacker.next_id(), ledger_id, wrong, 10**6)
    assert (await attacker.request(forged_lac)).status is Status.UNAUTHORIZED
    forged_add = _add(attacker.next_id(), ledger_id, 1, b"x", wrong, digest=None)
    assert (await attacker.request(forged_add)).status is Status.UNAUTHORIZED
    frame = _adds(attacker.next_id(), ledger_id, 1, 2, wrong)
    attacker.next_id()
    attacker.send(frame)
    assert {(await attacker.read_response()).status for _ in range(2)} == {Status.UNAUTHORIZED}
    await attacker.close()
    # The writer's LAC of 0: the polls answer now, with it (had a forged LAC woken them, they
    # would have answered already, with 10**6).
    assert (await writer.request(WriteLacRequest(writer.next_id(), ledger_id, key, 0))).status is (
        Status.OK
    )
    answers = {a.request_id: a for a in [await poller.read_response() for _ in range(2)]}
    lac_answer, entries_answer = answers[50], answers[51]
    assert isinstance(lac_answer, ReadLacResponse) and lac_answer.lac == 0, lac_answer
    assert isinstance(entries_answer, ReadEntriesResponse) and entries_answer.lac == 0
    await poller.close()
    await writer.close()
