"""`find_orphans` / `delete_orphans` (bkaio/stream/orphans.py): ledgers tagged for a stream that
no stream record names (a writer that crashed between creating its next ledger and the record's
compare-and-swap, a Spark job whose driver died, a deleted stream's leftovers) are found once
old enough, and deleted only while the record, read again right before, still does not name
them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bkaio.errors import NoSuchLedgerError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.stream import open_namespace
from bkaio.stream.errors import InvalidStreamArgumentError, NamespaceNotFoundError
from bkaio.stream.model import Segment, SegmentState
from bkaio.stream.orphans import OrphanLedger, OrphanOutcome, delete_orphans, find_orphans
from bkaio.stream.segments import (
    SPARK_JOB_KEY,
    SPARK_JOBS_PREFIX,
    STREAM_PASSWORD,
    stream_ledger_metadata,
)
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory


async def crash_between_create_and_cas(
    bk: BookKeeper, stream: str, epoch: int, job: str | None = None
) -> int:
    """What a writer (or a Spark task) leaves when it dies right after creating its ledger."""
    custom = stream_ledger_metadata("tenant", stream, epoch)
    if job is not None:
        custom[SPARK_JOB_KEY] = job.encode()
    handle = await bk.create_ledger(
        ensemble_size=3, write_quorum=2, ack_quorum=2, password=STREAM_PASSWORD,
        custom_metadata=custom,
    )  # fmt: skip
    await handle.append(b"lost")
    return handle.ledger_id


async def orphans_of(bk: BookKeeper, older_than: float = 0.0) -> list[OrphanLedger]:
    return [o async for o in find_orphans(bk, "tenant", older_than_seconds=older_than)]


async def outcomes(bk: BookKeeper, found: list[OrphanLedger]) -> list[OrphanOutcome]:
    return [o async for o in delete_orphans(bk, "tenant", found)]


async def test_an_orphan_is_listed_and_a_named_ledger_never(make_client: ClientFactory) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=4)
    for payload in (b"aaaa", b"bbbb", b"cccc"):  # Rolls: several named segments.
        await writer.write(payload)
    await writer.close()
    meta = await ns.stream_metadata("s")
    orphan_id = await crash_between_create_and_cas(bk, "s", meta.epoch + 1)
    other_ns = await open_namespace(bk, "other", create=True)
    await other_ns.create_stream("s")
    found = await orphans_of(bk)
    assert [o.ledger_id for o in found] == [orphan_id]
    (orphan,) = found
    assert orphan.stream == "s" and orphan.stream_exists and orphan.job is None
    assert orphan.epoch == meta.epoch + 1 and orphan.state == "OPEN"
    named = {segment.ledger_id for segment in meta.segments}
    assert named and not named & {o.ledger_id for o in found}


async def test_a_young_orphan_is_not_listed_under_the_default_age(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    await crash_between_create_and_cas(bk, "s", 1)
    assert [o async for o in find_orphans(bk, "tenant")] == []  # Default: an hour.
    assert len(await orphans_of(bk)) == 1


async def test_a_deleted_streams_ledgers_and_a_dead_spark_jobs_are_listed(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("live")
    left = await crash_between_create_and_cas(bk, "gone", 3)
    job_ledger = await crash_between_create_and_cas(bk, "live", 0, job="job-7")
    found = {o.ledger_id: o for o in await orphans_of(bk)}
    assert set(found) == {left, job_ledger}
    assert not found[left].stream_exists and found[left].stream == "gone"
    assert found[job_ledger].job == "job-7" and found[job_ledger].stream_exists


async def test_delete_removes_only_orphans_and_keeps_one_named_since_the_listing(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    await writer.write(b"kept")
    await writer.close()
    meta = await ns.stream_metadata("s")
    orphan_id = await crash_between_create_and_cas(bk, "s", meta.epoch + 1)
    late_id = await crash_between_create_and_cas(bk, "s", meta.epoch + 1)
    gone_id = await crash_between_create_and_cas(bk, "gone", 1)
    found = await orphans_of(bk)
    assert [o.ledger_id for o in found] == [orphan_id, late_id, gone_id]
    # A compare-and-swap names `late_id` after the listing, before the delete.
    store = StreamStore(metadata_of(bk))
    end = meta.end_seq_if_closed
    late = Segment(late_id, end, end - 1, SegmentState.CLOSED, ctime_ms=1, closed_ms=1)
    await store.put_stream("tenant", "s", replace(meta, segments=(*meta.segments, late)))
    done = {o.orphan.ledger_id: o for o in await outcomes(bk, found)}
    assert done[orphan_id].deleted and done[gone_id].deleted
    assert not done[late_id].deleted and "names it" in done[late_id].reason
    for ledger_id in (orphan_id, gone_id):
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(ledger_id)
    await bk.get_ledger_metadata(late_id)
    for segment in meta.segments:
        await bk.get_ledger_metadata(segment.ledger_id)
    assert await orphans_of(bk) == []


async def test_bad_input_is_refused_naming_it(make_client: ClientFactory) -> None:
    bk = await make_client()
    with pytest.raises(NamespaceNotFoundError, match="'nope'"):
        [o async for o in find_orphans(bk, "nope")]
    await open_namespace(bk, "tenant", create=True)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidStreamArgumentError, match="older_than_seconds"):
            await orphans_of(bk, bad)


async def test_delete_keeps_a_spark_jobs_ledger_its_registry_still_lists(
    make_client: ClientFactory,
) -> None:
    """A job running longer than --older-than has task ledgers no record names yet: while its
    registry lists one, the job may still publish it, so it is not deleted."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("live")
    running = await crash_between_create_and_cas(bk, "live", 0, job="job-8")
    dead = await crash_between_create_and_cas(bk, "live", 0, job="job-9")
    await metadata_of(bk).store.put(f"{SPARK_JOBS_PREFIX}job-8/{running}", b"")
    done = {o.orphan.ledger_id: o for o in await outcomes(bk, await orphans_of(bk))}
    assert not done[running].deleted and "job-8 still lists it" in done[running].reason
    assert done[dead].deleted
    await bk.get_ledger_metadata(running)
