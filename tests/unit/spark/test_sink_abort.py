"""The sink's abort against a task that registers its ledger after the abort read the job
registry (Spark cancels running tasks when it aborts, and may have started one late): the abort's
tombstone makes that task delete its own ledger, so nothing the job wrote is left behind."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import sink
from bkaio.spark.errors import SparkJobAbortedError
from bkaio.spark.options import WriteOptions
from bkaio.stream import open_namespace
from bkaio.stream.segments import STREAM_PASSWORD
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory

JOB = "job-1"
QUORUMS = sink.Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)


def options() -> WriteOptions:
    return WriteOptions(metadata="unused", namespace="tenant", stream="out")


async def tagged_ledgers(bk: BookKeeper) -> list[int]:
    found = []
    async for ledger_id in bk.list_ledgers():
        metadata = await bk.get_ledger_metadata(ledger_id)
        if sink.JOB_METADATA_KEY in metadata.custom_metadata:
            found.append(ledger_id)
    return found


async def test_a_task_registering_after_the_abort_deletes_its_ledger_and_fails(
    make_client: ClientFactory,
) -> None:
    driver, executor = await make_client(), await make_client()
    # The abort, as `BkaioBatchWriter.abort` runs it, before the task wrote anything.
    await sink.mark_aborted(driver, JOB)
    await sink.finish_job(driver, JOB, keep=())
    task = sink.TaskLedgerWriter(executor, options(), QUORUMS, JOB)
    with pytest.raises(SparkJobAbortedError, match="job-1 was aborted"):
        await task.append([b"row"])
    assert await tagged_ledgers(driver) == []
    assert await sink.job_ledgers(driver, JOB) == []


async def test_without_an_abort_the_task_writes_and_the_registry_names_its_ledger(
    make_client: ClientFactory,
) -> None:
    driver, executor = await make_client(), await make_client()
    await sink.mark_aborted(driver, "another-job")
    task = sink.TaskLedgerWriter(executor, options(), QUORUMS, JOB)
    await task.append([b"row 0", b"row 1"])
    written = await task.finish()
    assert written is not None and written.last_entry_id == 1
    assert await sink.job_ledgers(driver, JOB) == [written.ledger_id]
    assert await tagged_ledgers(driver) == [written.ledger_id]


async def test_the_tombstone_expires_with_its_lease(make_client: ClientFactory) -> None:
    driver = await make_client()
    await sink.mark_aborted(driver, JOB)
    tombstone = await metadata_of(driver).store.get(f"{sink.ABORTED_PREFIX}{JOB}")
    assert tombstone is not None and tombstone.lease != 0  # Nobody keeps the lease alive.
    assert await sink.job_aborted(driver, JOB)


async def test_an_abort_after_a_commit_whose_stream_cas_landed_keeps_the_published_ledgers(
    make_client: ClientFactory,
) -> None:
    """Spark aborts a job whose commit raised, also when the raise came after the stream CAS
    landed (the job registry's clean-up failed; the marker's 'done' write failed; the CAS's
    reply was lost and the re-read failed): the ledgers the stream now names must stay."""
    driver, executor = await make_client(), await make_client()
    await open_namespace(driver, "tenant", create=True)
    task = sink.TaskLedgerWriter(executor, options(), QUORUMS, JOB)
    await task.append([b"row 0", b"row 1"])
    written = await task.finish()
    assert written is not None
    await sink.publish(driver, options(), [written])  # Landed; then the commit failed.
    await sink.abort_job(driver, options(), JOB, [written.ledger_id])
    assert await tagged_ledgers(driver) == [written.ledger_id]  # Still there.
    stream = await StreamStore(metadata_of(driver)).get_stream("tenant", "out")
    assert [s.ledger_id for s in stream.segments] == [written.ledger_id]
    handle = await driver.open_ledger(written.ledger_id, password=STREAM_PASSWORD)
    assert [e.payload for e in await handle.read(0, 1)] == [b"row 0", b"row 1"]
    assert await sink.job_ledgers(driver, JOB) == []  # The registry is cleaned up all the same.


async def test_an_abort_deletes_what_the_stream_does_not_name(make_client: ClientFactory) -> None:
    driver, executor = await make_client(), await make_client()
    await open_namespace(driver, "tenant", create=True)
    tasks = [sink.TaskLedgerWriter(executor, options(), QUORUMS, JOB) for _ in range(3)]
    written = []
    for task in tasks:
        await task.append([b"row"])
        done = await task.finish()
        assert done is not None
        written.append(done)
    await sink.publish(driver, options(), written[:1])  # Another commit's, say.
    # Reported: the last one; registered only: the middle one (a task that never reported).
    await sink.abort_job(driver, options(), JOB, [written[2].ledger_id])
    assert await tagged_ledgers(driver) == [written[0].ledger_id]
    assert await sink.job_ledgers(driver, JOB) == []
