"""A sink's publish whose stream record lands after delete_namespace finished: it created the
stream under a namespace that no longer existed. It now finds the namespace gone once its record
landed, removes the stream and fails; the job's ledgers, which no record ever named (the stream
is created empty before the CAS that appends them), go with the abort Spark runs then."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.spark import sink
from bkaio.spark.options import WriteOptions
from bkaio.stream import NamespaceNotFoundError, delete_namespace, open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_namespace_deletion_race import NOTHING, leftovers

QUORUMS = sink.Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)


async def test_a_publish_landing_after_the_namespace_was_deleted_leaves_nothing(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver, admin = await make_client(), await make_client()
    await open_namespace(admin, "tenant", create=True)
    options = WriteOptions(metadata="unused", namespace="tenant", stream="out")
    task = sink.TaskLedgerWriter(driver, options, QUORUMS, "job-1")
    await task.append([b"row 0", b"row 1"])
    written = await task.finish()
    assert written is not None
    await sink.finish_job(driver, "job-1", keep=[written.ledger_id])
    real_put = StreamStore.put_stream
    about_to_create, deleted = asyncio.Event(), asyncio.Event()

    async def put_after_the_deletion(
        self: StreamStore, namespace: str, stream: str, meta: StreamMeta
    ) -> StreamMeta:
        if meta.version == 0 and not deleted.is_set():
            about_to_create.set()
            await deleted.wait()
        return await real_put(self, namespace, stream, meta)

    monkeypatch.setattr(StreamStore, "put_stream", put_after_the_deletion)
    publishing = asyncio.create_task(sink.publish(driver, options, [written]))
    await about_to_create.wait()
    await delete_namespace(admin, "tenant")
    deleted.set()
    with pytest.raises(NamespaceNotFoundError, match="does not exist"):
        await publishing
    await sink.abort_job(driver, options, "job-1", [written.ledger_id])  # As Spark does then.
    assert await leftovers(admin, "tenant") == NOTHING
