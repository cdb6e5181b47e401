"""Streaming batch ids below the sink marker's (`sink.publish_batch`). Spark re-runs only the
last batch of a query, so a lower id is no replay: batch 0 is a new query reusing the sinkId
(a reset checkpointLocation) and must fail rather than have every batch dropped; another id
(an older checkpoint restored) is skipped as already written, with a WARNING and a count.
Before, both were dropped in silence."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import sink
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import WriteOptions
from bkaio.stream import open_namespace
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory

QUORUMS = sink.Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)
OPTIONS = WriteOptions(metadata="unused", namespace="tenant", stream="out", sink_id="/ckpt/q")


async def batch(bk: BookKeeper, batch_id: int) -> tuple[bool, int]:
    """Write one row as a task of batch `batch_id` and commit it: (published, its ledger)."""
    task = sink.TaskLedgerWriter(bk, OPTIONS, QUORUMS, f"job-{batch_id}")
    await task.append([f"batch {batch_id}".encode()])
    written = await task.finish()
    assert written is not None
    return await sink.publish_batch(bk, OPTIONS, batch_id, [written]), written.ledger_id


async def segments(bk: BookKeeper) -> list[int]:
    stream = await StreamStore(metadata_of(bk)).get_stream("tenant", "out")
    return [s.ledger_id for s in stream.segments]


def stale_batches() -> float:
    return REGISTRY.get_sample_value("bkaio_spark_sink_stale_batches_total") or 0.0


async def test_a_new_query_reusing_the_sink_id_fails_at_batch_0(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await open_namespace(bk, "tenant", create=True)
    published = [await batch(bk, batch_id) for batch_id in range(3)]
    assert all(done for done, _ in published)
    with pytest.raises(SparkOptionError, match=r"'/ckpt/q' already published batch 2.*batch 0"):
        await batch(bk, 0)
    assert await segments(bk) == [ledger for _, ledger in published]
    assert len([i async for i in bk.list_ledgers()]) == 3  # The refused batch's ledger is gone.


async def test_an_older_batch_id_is_skipped_with_a_warning_and_counted(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await open_namespace(bk, "tenant", create=True)
    published = [await batch(bk, batch_id) for batch_id in range(4)]
    before = stale_batches()
    with capture_logs() as logs:
        done, _ledger = await batch(bk, 2)
    assert not done
    assert await segments(bk) == [ledger for _, ledger in published]
    warnings = [e for e in logs if e["event"] == "spark_sink_batch_behind_marker"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"
    assert (warnings[0]["sink_id"], warnings[0]["batch_id"], warnings[0]["last_batch_id"]) == (
        "/ckpt/q",
        2,
        3,
    )
    assert stale_batches() == before + 1


async def test_a_replay_of_the_last_batch_is_still_dropped_quietly(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await open_namespace(bk, "tenant", create=True)
    published = [await batch(bk, batch_id) for batch_id in range(2)]
    before = stale_batches()
    done, _ledger = await batch(bk, 1)
    assert not done
    assert await segments(bk) == [ledger for _, ledger in published]
    assert stale_batches() == before
