"""The stream layer's compare-and-swap loops give up after MAX_METADATA_ATTEMPTS.

A metadata store that loses the answer to every write of a record (MetadataOutcomeUnknownError,
nothing written) or refuses every one as stale (MetadataVersionError, as if another client
always wrote first) made them retry back to back for ever; now each raises MetadataError and
leaves the record (and the ledgers it names) as it was.

A StreamStore write raising MetadataOutcomeUnknownError has already read the record back after
each lost answer (bkaio/meta/conditional.py) and gave up after MAX_METADATA_ATTEMPTS copies,
the last of which may still land: the stream layer passes it on at once, deleting nothing
such a copy would name.
"""

from __future__ import annotations

from typing import Any

import pytest

from bkaio.errors import MetadataError, MetadataVersionError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS
from bkaio.spark.options import WriteOptions
from bkaio.spark.sink import WrittenLedger, publish
from bkaio.stream import Namespace, StreamPosition, open_namespace
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory

LOSSES = pytest.mark.parametrize(
    "losing", [MetadataOutcomeUnknownError, MetadataVersionError], ids=["lost", "conflict"]
)


class Losing:
    """Stands for a `StreamStore` write: every call fails with `error` and writes nothing."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.calls = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        # Without a bound the caller never stops: fail the test rather than hang it.
        assert self.calls < 10 * MAX_METADATA_ATTEMPTS, "a stream record write without bound"
        raise self.error("connection lost during the write")


def expected_calls(losing: type[Exception]) -> int:
    return 1 if losing is MetadataOutcomeUnknownError else MAX_METADATA_ATTEMPTS


def gave_up(losing: type[Exception], step: str) -> Any:
    """What the call raises: the store's give-up (passed on at once), or the layer's own."""
    if losing is MetadataOutcomeUnknownError:
        return pytest.raises(MetadataOutcomeUnknownError, match="connection lost")
    return pytest.raises(MetadataError, match=f"stream tenant/s: gave up {step}")


def lose(monkeypatch: pytest.MonkeyPatch, method: str, error: type[Exception]) -> Losing:
    losing = Losing(error)
    monkeypatch.setattr(StreamStore, method, losing)
    return losing


async def ledger_ids(ns: Namespace) -> list[int]:
    return [i async for i in metadata_of(ns._bk).ledgers.list_ids()]


async def closed_stream(make_client: ClientFactory) -> Namespace:
    """Namespace "tenant" with stream "s": three sealed one-record segments."""
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    for i in range(3):
        await writer.write(b"%010d" % i)
    await writer.close()
    return ns


async def test_updating_settings_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    losing = lose(monkeypatch, "put_namespace", MetadataVersionError)
    with pytest.raises(MetadataError, match="namespace tenant: gave up updating its settings"):
        await ns.update_settings(quota_bytes=1000)
    assert losing.calls == MAX_METADATA_ATTEMPTS
    assert (await ns.refresh()).quota_bytes is None


async def test_creating_a_stream_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    losing = lose(monkeypatch, "put_stream", MetadataVersionError)
    with pytest.raises(MetadataError, match="stream tenant/s: gave up creating it"):
        await ns.create_stream("s")
    assert losing.calls == MAX_METADATA_ATTEMPTS
    assert await ns.list_streams() == []


@LOSSES
async def test_deleting_a_stream_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, losing: type[Exception]
) -> None:
    ns = await closed_stream(make_client)
    before, ledgers = await ns.stream_metadata("s"), await ledger_ids(ns)
    lost = lose(monkeypatch, "delete_stream", losing)
    with gave_up(losing, "deleting its record"):
        await ns.delete_stream("s")
    assert lost.calls == expected_calls(losing)
    assert await ns.stream_metadata("s") == before
    assert await ledger_ids(ns) == ledgers


@LOSSES
async def test_truncating_a_stream_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, losing: type[Exception]
) -> None:
    ns = await closed_stream(make_client)
    before, ledgers = await ns.stream_metadata("s"), await ledger_ids(ns)
    lost = lose(monkeypatch, "put_stream", losing)
    with gave_up(losing, "truncating it"):
        await ns.truncate("s", before=StreamPosition(0, 0, 2))
    assert lost.calls == expected_calls(losing)
    assert await ns.stream_metadata("s") == before
    assert await ledger_ids(ns) == ledgers


@LOSSES
async def test_opening_a_writer_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, losing: type[Exception]
) -> None:
    ns = await closed_stream(make_client)
    before, ledgers = await ns.stream_metadata("s"), await ledger_ids(ns)
    lost = lose(monkeypatch, "put_stream", losing)
    with gave_up(losing, "opening a writer"):
        await ns.open_writer("s")
    assert lost.calls == expected_calls(losing)
    assert await ns.stream_metadata("s") == before
    if losing is MetadataOutcomeUnknownError:  # The last copy may land naming it: kept.
        assert len(await ledger_ids(ns)) == len(ledgers) + 1
    else:
        assert await ledger_ids(ns) == ledgers  # Each attempt's new ledger was deleted.


@LOSSES
@pytest.mark.parametrize("closing", [False, True], ids=["roll", "close"])
async def test_a_writers_roll_or_close_gives_up(
    make_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
    losing: type[Exception],
    closing: bool,
) -> None:
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    before = await ns.stream_metadata("s")
    lost = lose(monkeypatch, "put_stream", losing)
    step = "recording its segments"
    if closing:
        await writer.write(b"short")
        with gave_up(losing, step):
            await writer.close()
    else:
        await writer.write(b"0123456789")  # Fills the segment: the roll loses every write.
        await writer.wait_for_capacity()
        with gave_up(losing, step):
            await writer.write(b"after the roll")
        await writer.__aexit__(None, None, None)
    assert lost.calls == expected_calls(losing)
    assert await ns.stream_metadata("s") == before


@LOSSES
async def test_a_spark_sinks_publish_gives_up(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, losing: type[Exception]
) -> None:
    # bkaio/spark/sink.py publish(): the commit of a Spark write appends its ledgers to the
    # stream in one compare-and-swap, which it retried without bound.
    ns = await closed_stream(make_client)
    before = await ns._store.find_stream("tenant", "s")
    handle = await ns._bk.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
    await handle.append(b"from spark")
    await handle.close()
    written = [WrittenLedger(ledger_id=handle.ledger_id, last_entry_id=0, bytes=10)]
    options = WriteOptions(metadata="sqlite:///unused", namespace="tenant", stream="s")
    puts = lose(monkeypatch, "put_stream", losing)
    with pytest.raises(MetadataError, match="stream tenant/s: gave up adding the job's ledgers"):
        await publish(ns._bk, options, written)
    assert puts.calls == MAX_METADATA_ATTEMPTS
    assert await ns._store.find_stream("tenant", "s") == before
