"""The sink's abort against a task that registers its ledger after the abort read the job
registry (Spark cancels running tasks when it aborts, and may have started one late): the abort's
tombstone makes that task delete its own ledger, so nothing the job wrote is left behind."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import sink
from bkaio.spark.errors import SparkJobAbortedError
from bkaio.spark.options import WriteOptions
from bkaio.stream.store import metadata_of
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
