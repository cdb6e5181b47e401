"""The sink's abort against a commit whose stream CAS was sent, its answer lost, and applied by
the metadata store only after the abort did its work (an etcd member paused or cut off with the
request buffered forwards it when it comes back). Spark aborts the job once the commit raised:
the abort must leave no way for that late write to land, or the stream would name ledgers the
abort deleted (every reader failing with NoSuchLedger there) and Spark's retry would write the
batch's rows a second time. Likewise a streaming batch replayed after its driver died while
its first run's CAS was on its way.

Also what the abort changes when nothing of the job can land: a job with nothing to delete
leaves the stream record as it is, and a live StreamWriter of the stream carries on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import msgpack
import pytest

from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import Metadata, require_initialised
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import Lease
from bkaio.spark import sink
from bkaio.spark.options import WriteOptions
from bkaio.stream import TooManyStreamsError, open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.reader import StreamReader
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.ledger_client.fakes import FakeBookieOps
from tests.unit.stream.conftest import BOOKIE_IDS, ClientFactory
from tests.unit.stream.test_streams import take

JOB = "job-1"
QUORUMS = sink.Quorums(ensemble_size=3, write_quorum=3, ack_quorum=2)
STREAM_KEY = StreamStore.stream_key("tenant", "out")


def options() -> WriteOptions:
    return WriteOptions(metadata="unused", namespace="tenant", stream="out")


class FakeLateCasStore(SqliteMetadataStore):
    """Loses the answer of every write of the stream record that names `ledger_id` without
    applying it, and keeps it: `land_late` applies the kept writes afterwards, in order, as a
    member forwarding buffered requests would."""

    ledger_id: int | None = None
    held: list[tuple[bytes, int]]

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        if key == STREAM_KEY and self.ledger_id is not None:
            record = StreamMeta.from_dict(key, msgpack.unpackb(value, raw=False), 0)
            if self.ledger_id in {s.ledger_id for s in record.segments}:
                self.held.append((value, expected_version))
                raise MetadataOutcomeUnknownError(f"lost the answer for {key} (fake)")
        return await super().compare_and_swap(
            key, value, expected_version=expected_version, lease=lease
        )

    async def land_late(self) -> list[str]:
        """Apply the kept writes; what became of each ('landed' or 'refused'). Later writes
        go through."""
        self.ledger_id = None
        outcomes = []
        for value, expected_version in self.held:
            try:
                await super().compare_and_swap(STREAM_KEY, value, expected_version=expected_version)
                outcomes.append("landed")
            except MetadataVersionError:
                outcomes.append("refused")
        return outcomes


@pytest.fixture
async def driver(
    make_client: ClientFactory, tmp_path: Path, fake_bookies: FakeBookieOps
) -> AsyncIterator[tuple[BookKeeper, FakeLateCasStore]]:
    """A driver whose metadata connection is a FakeLateCasStore (same SQLite file and bookies
    as `make_client`'s clients, which initialised the cluster)."""
    await make_client()
    store = await FakeLateCasStore.open(f"sqlite://{tmp_path / 'meta.db'}", create=False)
    store.held = []
    metadata = Metadata(store, await require_initialised(store), id_block_size=1000)
    client = BookKeeper(
        ledgers=metadata.ledgers,
        ops=fake_bookies,
        config=ClientConfig(add_timeout=0.5, read_timeout=0.5),
        metadata=metadata,
    )
    client.set_bookies([fake_bookies.info(bookie_id) for bookie_id in BOOKIE_IDS])
    try:
        yield client, store
    finally:
        await client.close()


async def task_ledger(
    executor: BookKeeper, rows: list[bytes], job: str = JOB
) -> sink.WrittenLedger:
    task = sink.TaskLedgerWriter(executor, options(), QUORUMS, job)
    await task.append(rows)
    written = await task.finish()
    assert written is not None
    return written


async def missing_ledgers(bk: BookKeeper, meta: StreamMeta | None) -> list[int]:
    """The ledgers `meta` names that do not exist (a reader fails with NoSuchLedger there)."""
    existing = {ledger_id async for ledger_id in bk.list_ledgers()}
    return [s.ledger_id for s in (meta.segments if meta else ()) if s.ledger_id not in existing]


@pytest.mark.parametrize("stream_exists", [True, False], ids=["append", "create"])
async def test_a_commit_cas_applied_after_the_abort_never_lands(
    make_client: ClientFactory,
    driver: tuple[BookKeeper, FakeLateCasStore],
    stream_exists: bool,
) -> None:
    bk, late = driver
    executor = await make_client()
    await open_namespace(executor, "tenant", create=True)
    before: list[int] = []
    if stream_exists:  # Another job's commit made the stream earlier.
        earlier = await task_ledger(executor, [b"earlier"], job="job-0")
        await sink.publish(executor, options(), [earlier])
        before = [earlier.ledger_id]
    written = await task_ledger(executor, [b"row 0", b"row 1"])
    late.ledger_id = written.ledger_id
    with pytest.raises(MetadataError):  # Every answer lost: the commit raises...
        await sink.publish(bk, options(), [written])
    assert late.held  # ...with its writes still on their way.
    await sink.abort_job(bk, options(), JOB, [written.ledger_id])  # What Spark does then.
    outcomes = await late.land_late()
    meta = await StreamStore(metadata_of(executor)).find_stream("tenant", "out")
    assert await missing_ledgers(executor, meta) == []
    assert outcomes == ["refused"] * len(late.held)
    assert meta is not None and [s.ledger_id for s in meta.segments] == before
    assert written.ledger_id not in {i async for i in executor.list_ledgers()}
    assert await sink.job_ledgers(executor, JOB) == []


async def test_an_abort_after_the_late_cas_landed_keeps_what_it_named(
    make_client: ClientFactory, driver: tuple[BookKeeper, FakeLateCasStore]
) -> None:
    """The lost write lands while the abort runs, after it read the record: the abort's fence
    meets the new version, reads again, and keeps the ledger the stream now names."""
    bk, late = driver
    executor = await make_client()
    await open_namespace(executor, "tenant", create=True)
    written = await task_ledger(executor, [b"row"])
    late.ledger_id = written.ledger_id
    with pytest.raises(MetadataError):
        await sink.publish(bk, options(), [written])
    real_find = StreamStore.find_stream
    landed: list[str] = []

    async def find_then_land(self: StreamStore, namespace: str, stream: str) -> StreamMeta | None:
        meta = await real_find(self, namespace, stream)
        if not landed:
            landed.extend(await late.land_late())
        return meta

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StreamStore, "find_stream", find_then_land)
        await sink.abort_job(bk, options(), JOB, [written.ledger_id])
    assert landed[0] == "landed" and set(landed[1:]) <= {"refused"}
    meta = await StreamStore(metadata_of(executor)).get_stream("tenant", "out")
    assert [s.ledger_id for s in meta.segments] == [written.ledger_id]
    assert await missing_ledgers(executor, meta) == []


async def test_an_abort_with_nothing_to_delete_leaves_the_record_alone(
    make_client: ClientFactory,
) -> None:
    client = await make_client()
    await open_namespace(client, "tenant", create=True)
    await sink.publish(client, options(), [await task_ledger(client, [b"row"], job="job-0")])
    store = StreamStore(metadata_of(client))
    before = await store.get_stream("tenant", "out")
    await sink.abort_job(client, options(), JOB, [])  # Its tasks wrote nothing.
    assert await store.get_stream("tenant", "out") == before  # Same version too.


async def test_an_abort_rewrites_the_record_unchanged_and_a_live_writer_carries_on(
    make_client: ClientFactory,
) -> None:
    """A job failed (nothing of it committed) while an application writes the same stream: the
    abort moves the record's version, content unchanged; the writer's next record update (its
    close here, a roll likewise) reads it again and goes on, not fenced."""
    app, executor = await make_client(), await make_client()
    ns = await open_namespace(app, "tenant", create=True)
    writer = await ns.open_writer("out")
    first = await writer.write(b"before the abort")
    store = StreamStore(metadata_of(app))
    before = await store.get_stream("tenant", "out")
    written = await task_ledger(executor, [b"never published"])
    await sink.abort_job(executor, options(), JOB, [written.ledger_id])
    after = await store.get_stream("tenant", "out")
    assert after.version > before.version
    assert after == replace(before, version=after.version)  # Same epoch and segments.
    second = await writer.write(b"after the abort")
    await writer.close()
    reader: StreamReader = await ns.open_reader("out", long_poll_seconds=0.2)
    records = await take(reader, 2)
    await reader.close()
    assert [r.position for r in records] == [first, second]
    assert written.ledger_id not in {i async for i in executor.list_ledgers()}


async def test_a_publish_creating_its_stream_counts_against_max_streams(
    make_client: ClientFactory,
) -> None:
    """The stream is created as `create_stream` creates one, limits included."""
    client = await make_client()
    ns = await open_namespace(client, "tenant", create=True, max_streams=1)
    await ns.create_stream("other")
    with pytest.raises(TooManyStreamsError, match="max_streams=1"):
        await sink.publish(client, options(), [await task_ledger(client, [b"row"])])
    assert await ns.list_streams() == ["other"]


@pytest.mark.parametrize("stream_exists", [True, False], ids=["append", "create"])
async def test_a_replayed_batch_fences_its_first_commit_before_deleting_its_ledgers(
    make_client: ClientFactory,
    driver: tuple[BookKeeper, FakeLateCasStore],
    monkeypatch: pytest.MonkeyPatch,
    stream_exists: bool,
) -> None:
    """A streaming batch's commit lost its CAS's reply and the driver died (no abort ran); the
    restarted query replays the batch, finds the marker not done and the stream not naming the
    marked ledgers, deletes them and publishes its own. The first commit's CAS, applied late
    (here: just after that deletion), must not land."""
    bk, late = driver
    executor = await make_client()
    await open_namespace(executor, "tenant", create=True)
    streaming = replace(options(), sink_id="/ckpt/q")
    if stream_exists:
        earlier = await task_ledger(executor, [b"batch 0"], job="job-0")
        assert await sink.publish_batch(executor, streaming, 0, [earlier])
    first = await task_ledger(executor, [b"batch 1, first run"])
    late.ledger_id = first.ledger_id
    with pytest.raises(MetadataError):
        await sink.publish_batch(bk, streaming, 1, [first])
    assert late.held  # The driver dies here.
    replayed = await task_ledger(executor, [b"batch 1, replayed"], job="job-2")
    real_put = FakeLateCasStore.put
    landed: list[str] = []

    async def land_after_the_deletion(
        self: FakeLateCasStore, key: str, value: bytes, *, lease: Lease | None = None
    ) -> int:
        if key.startswith(sink.SINKS_PREFIX) and not landed:  # The replay's marker.
            landed.extend(await late.land_late())
        return await real_put(self, key, value, lease=lease)

    monkeypatch.setattr(FakeLateCasStore, "put", land_after_the_deletion)
    assert await sink.publish_batch(bk, streaming, 1, [replayed])
    meta = await StreamStore(metadata_of(executor)).get_stream("tenant", "out")
    assert await missing_ledgers(executor, meta) == []
    assert landed == ["refused"] * len(late.held)
    before = [earlier.ledger_id] if stream_exists else []
    assert [s.ledger_id for s in meta.segments] == [*before, replayed.ledger_id]
