"""The in-memory metadata driver's simulated faults (the contract itself runs in
tests/integration/meta/test_store_contract.py against every driver)."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from bkaio.meta.errors import LeaseExpiredError, MetadataOutcomeUnknownError, WatchCompactedError
from bkaio.meta.store import EventKind
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimLoop
from bkaio.testing.sim.meta import LostAnswer, MemoryMetadataServer, StoreFaults


def test_a_lost_answer_leaves_the_write_applied() -> None:
    async def main() -> tuple[bool, bytes | None, float]:
        server = MemoryMetadataServer()
        faults = StoreFaults(
            random.Random(1),
            latency=(0.01, 0.01),
            lost_answer=1.0,
            lost_kinds=(LostAnswer.APPLIED,),
        )
        store = server.connect(faults)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await store.compare_and_swap("/k", b"v", expected_version=0)
        except MetadataOutcomeUnknownError:
            unknown = True
        else:
            unknown = False
        kv = await server.connect().get("/k")
        return unknown, None if kv is None else kv.value, loop.time() - started

    loop = SimLoop(random.Random(0))
    with sealed():
        unknown, value, elapsed = loop.run_until_complete(main())
    loop.close()
    assert unknown and value == b"v"
    assert elapsed == pytest.approx(0.02, abs=0.001)  # There and (the lost answer) back.


def _lose(kind: LostAnswer, notes: list[str]) -> StoreFaults:
    return StoreFaults(
        random.Random(1),
        latency=(0.01, 0.01),
        lost_answer=1.0,
        lost_kinds=(kind,),
        late_by=((0.5, 0.5),),
        note=notes.append,
    )


def test_a_lost_answer_may_leave_the_write_not_applied() -> None:
    async def main() -> tuple[int, bytes, list[str]]:
        server = MemoryMetadataServer()
        plain = server.connect()
        assert await plain.put("/k", b"old") == 2  # The key's version (its revision).
        notes: list[str] = []
        store = server.connect(_lose(LostAnswer.NOT_APPLIED, notes))
        with pytest.raises(MetadataOutcomeUnknownError):
            await store.compare_and_swap("/k", b"new", expected_version=2)
        with pytest.raises(MetadataOutcomeUnknownError):
            await store.delete("/k", expected_version=2)
        await asyncio.sleep(10)  # Nothing lands later either.
        kv = await plain.get("/k")
        assert kv is not None
        return kv.version, kv.value, notes

    loop = SimLoop(random.Random(0))
    with sealed():
        version, value, notes = loop.run_until_complete(main())
    loop.close()
    assert (version, value) == (2, b"old")
    assert notes == [
        "CAS /k at version 2: answer lost, never reached the store",
        "delete /k at version 2: answer lost, never reached the store",
    ]


def test_a_late_write_lands_after_the_caller_read_back_conditioned_as_sent() -> None:
    """Held 0.5 s: the caller's read-back finds the old version and sends its copy again
    (applied); the late first copy then lands on version 2, which is gone: refused, silently.
    A late versioned delete on the version it expected lands and deletes the key."""

    async def main() -> tuple[list[tuple[float, int, bytes]], bool, list[str]]:
        loop = asyncio.get_running_loop()
        server = MemoryMetadataServer()
        plain = server.connect()
        assert await plain.put("/k", b"v1") == 2  # The key's version (its revision).
        notes: list[str] = []
        store = server.connect(_lose(LostAnswer.LATE, notes))
        started = loop.time()
        with pytest.raises(MetadataOutcomeUnknownError):
            await store.compare_and_swap("/k", b"first", expected_version=2)
        seen = []
        kv = await plain.get("/k")
        assert kv is not None
        seen.append((loop.time() - started, kv.version, kv.value))  # Not there yet.
        assert await plain.compare_and_swap("/k", b"again", expected_version=2) == 3
        await asyncio.sleep(0.6)
        kv = await plain.get("/k")
        assert kv is not None
        seen.append((loop.time() - started, kv.version, kv.value))  # Refused: still "again".
        with pytest.raises(MetadataOutcomeUnknownError):
            await store.delete("/k", expected_version=3)
        there = await plain.get("/k") is not None
        await asyncio.sleep(0.6)
        return seen, there and await plain.get("/k") is None, notes

    loop = SimLoop(random.Random(0))
    with sealed():
        seen, deleted_late, notes = loop.run_until_complete(main())
    loop.close()
    assert [(version, value) for _, version, value in seen] == [(2, b"v1"), (3, b"again")]
    assert seen[0][0] < 0.5 < seen[1][0]
    assert deleted_late
    assert len(notes) == 2
    assert "CAS /k at version 2: answer lost, reached the store late: refused" in notes[0]
    assert notes[1] == "delete /k at version 3: answer lost, reached the store late: done"


def test_lost_answers_are_drawn_from_the_seed() -> None:
    """The same seed loses the same answers in the same ways; every kind turns up."""

    async def main(seed: int) -> list[str]:
        server = MemoryMetadataServer()
        notes: list[str] = []
        faults = StoreFaults(random.Random(seed), lost_answer=0.5, note=notes.append)
        store = server.connect(faults)
        version = 0
        for _ in range(60):
            with contextlib.suppress(MetadataOutcomeUnknownError):
                await store.compare_and_swap("/k", b"x", expected_version=version)
            kv = await server.connect().get("/k")
            version = 0 if kv is None else kv.version
        await asyncio.sleep(1)
        return notes

    runs = []
    for _ in range(2):
        loop = SimLoop(random.Random(0))
        with sealed():
            runs.append(loop.run_until_complete(main(7)))
        loop.close()
    assert runs[0] == runs[1]
    text = "\n".join(runs[0])
    for kind in ("at once: ", "never reached", "late: "):
        assert kind in text, kind


def test_leases_expire_on_virtual_time_and_watches_see_the_delete() -> None:
    async def main() -> list[tuple[EventKind, str]]:
        server = MemoryMetadataServer()
        store = server.connect()
        start = await store.current_revision() + 1
        lease = await store.grant_lease(10)
        await store.put("/bookies/b1", b"x", lease=lease)
        await asyncio.sleep(11)  # No keep-alive: gone after the TTL.
        assert await store.get("/bookies/b1") is None
        seen = []
        async for event in store.watch_prefix("/bookies/", start_revision=start):
            seen.append((event.kind, event.key))
            if len(seen) == 2:
                break
        return seen

    loop = SimLoop(random.Random(0))
    with sealed():
        seen = loop.run_until_complete(main())
    loop.close()
    assert seen == [(EventKind.PUT, "/bookies/b1"), (EventKind.DELETE, "/bookies/b1")]


def test_a_grant_answered_late_counts_its_ttl_from_the_request() -> None:
    """The server grants a 1 s lease 1.5 s after the request and the answer takes 1.5 s more:
    the server drops the lease before the holder has it, so the holder must find it in doubt
    at once (as with the real drivers), not certain for a TTL after the answer came."""

    async def main() -> tuple[bool, bool, bool]:
        server = MemoryMetadataServer()
        store = server.connect(StoreFaults(random.Random(1), latency=(1.5, 1.5)))
        lease = await store.grant_lease(1.0)
        in_doubt, lost = lease.in_doubt, lease.lost
        try:
            await lease.keep_alive()
        except LeaseExpiredError:
            return in_doubt, lost, True
        return in_doubt, lost, False

    loop = SimLoop(random.Random(0))
    with sealed():
        in_doubt, lost, gone_in_the_store = loop.run_until_complete(main())
    loop.close()
    assert gone_in_the_store
    assert in_doubt and not lost


async def test_a_watch_from_a_compacted_revision_fails() -> None:
    server = MemoryMetadataServer(changes_kept=3)
    store = server.connect()
    first = await store.put("/a", b"1")
    for value in (b"2", b"3", b"4", b"5"):
        await store.put("/a", value)
    with pytest.raises(WatchCompactedError):
        async for _ in store.watch_prefix("/", start_revision=first):
            break
