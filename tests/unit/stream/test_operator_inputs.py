"""Inputs an operator or a library user gets wrong (found by an operator walk-through): each is
refused with an error that says what is wrong, and nothing is lost. Fake bookies + SQLite."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest

from bkaio.cli.main import main
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.stream import (
    InvalidStreamArgumentError,
    Namespace,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    RetentionReport,
    StreamPosition,
    apply_retention,
    create_namespace,
    delete_namespace,
    open_namespace,
    run_retention,
)
from bkaio.stream.model import NamespaceSettings, Segment, SegmentState
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take

HUGE = 10**23  # A typo's worth of zeros: past the 64 bits a metadata record holds.

# Each bad setting and what the error says of it: the setting's name and its range.
BAD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"quota_bytes": HUGE}, r"quota_bytes=10+ must be a whole number in \[1, 2\*\*63 - 1\]"),
    ({"retention_bytes": HUGE}, r"retention_bytes=10+ must be a whole number in \[1, "),
    ({"max_streams": HUGE}, r"max_streams=10+ must be a whole number in \[1, "),
    ({"retention_seconds": HUGE}, r"retention_seconds=10+ must be a number of seconds in \(0, "),
    ({"ensemble_size": HUGE}, r"ensemble_size=10+ must be a whole number in \[1, "),
    ({"quota_bytes": True}, r"quota_bytes=True must be a whole number"),
    ({"retention_bytes": 1.5}, r"retention_bytes=1.5 must be a whole number"),
    ({"ensemble_size": "3"}, r"ensemble_size='3' must be a whole number"),
    ({"retention_seconds": float("nan")}, r"retention_seconds=nan must be a number of seconds"),
    ({"rack_labels": "r1"}, r"rack_labels='r1' must be a tuple \(or list\) of str"),
    ({"retention_ignores_cursors": "no"}, r"retention_ignores_cursors='no' must be True or False"),
]


async def test_a_namespace_not_empty_says_how_to_force_from_the_api_and_the_cli(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    with pytest.raises(NamespaceNotEmptyError) as raised:
        await delete_namespace(bk, "tenant")
    assert "force=True (the CLI's --force)" in str(raised.value)
    assert await ns.list_streams() == ["s"]  # Nothing removed.


async def _stream_over_its_retention(bk: BookKeeper) -> Namespace:
    """Namespace "tenant" whose stream "s" holds 10 sealed segments of 10 bytes each, over its
    retention_bytes=20."""
    ns = await open_namespace(bk, "tenant", create=True, retention_bytes=20)
    writer = await ns.open_writer("s", roll_bytes=10)
    await asyncio.gather(*(writer.write(b"r" * 10) for _ in range(10)))
    await writer.close()
    return ns


async def test_retention_of_an_unknown_namespace_is_namespace_not_found(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await _stream_over_its_retention(bk)
    before = await ns.stream_metadata("s")
    for names in (["nope"], ["tenant", "nope"]):
        with pytest.raises(NamespaceNotFoundError, match="nope"):
            await apply_retention(bk, names)
    assert await ns.stream_metadata("s") == before  # Refused before any namespace is touched.
    [report] = await apply_retention(bk)  # All namespaces: the one that exists.
    assert report.namespace == "tenant" and report.removed["s"]


async def test_a_retention_loop_goes_on_past_a_namespace_that_is_gone(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await _stream_over_its_retention(bk)
    reports: asyncio.Queue[RetentionReport] = asyncio.Queue()
    loop = asyncio.create_task(
        run_retention(
            bk, interval_seconds=3600, namespaces=["gone", "tenant"], on_report=reports.put
        )
    )
    try:
        report = await asyncio.wait_for(reports.get(), 30)  # Guards a hang, times nothing.
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    assert report.namespace == "tenant" and report.removed["s"]


@pytest.mark.parametrize(("setting", "error"), BAD_SETTINGS, ids=lambda v: str(v)[:30])
async def test_a_namespace_setting_out_of_range_is_refused_naming_it(
    make_client: ClientFactory, setting: dict[str, Any], error: str
) -> None:
    """Refused when the namespace is created or its settings changed, before the metadata write
    (which failed with msgpack's OverflowError, or stored 'r1' as the racks 'r' and '1')."""
    bk = await make_client()
    with pytest.raises(InvalidStreamArgumentError, match=f"^namespace {error}"):
        await create_namespace(bk, "a", **setting)
    with pytest.raises(InvalidStreamArgumentError, match=f"^namespace {error}"):
        await open_namespace(bk, "b", create=True, **setting)
    with pytest.raises(NamespaceNotFoundError):
        await open_namespace(bk, "a")  # Nothing was created.
    ns = await open_namespace(bk, "c", create=True)
    with pytest.raises(InvalidStreamArgumentError, match=f"^namespace {error}"):
        await ns.update_settings(**setting)
    assert await ns.refresh() == ns.settings  # Nothing was changed.


async def test_the_largest_settings_are_stored_and_read_back(make_client: ClientFactory) -> None:
    bk = await make_client()
    top = 2**63 - 1
    wide = {"quota_bytes": top, "retention_bytes": top, "max_streams": top}
    ns = await open_namespace(bk, "a", create=True, retention_seconds=0.5, **wide)
    assert await ns.refresh() == ns.settings
    assert ns.settings.quota_bytes == top and ns.settings.retention_seconds == 0.5
    listed = await open_namespace(bk, "b", create=True, rack_labels=["r1", "r2"])
    assert listed.settings.rack_labels == ("r1", "r2")


def test_counts_an_older_build_stored_as_fractions_stay_readable() -> None:
    """Older builds took quota_bytes=1.5 or True; such a record still reads (whole part)."""
    record = NamespaceSettings().to_dict() | {"quota_bytes": 1.5, "max_streams": True}
    stored = msgpack.unpackb(msgpack.packb(record))
    settings = NamespaceSettings.from_dict("/namespaces/old", stored, version=3)
    assert (settings.quota_bytes, settings.max_streams) == (1, 1)


async def test_truncating_past_the_end_is_refused_naming_the_next_seq(
    make_client: ClientFactory,
) -> None:
    """A seq with a zero too many removed every sealed segment; now nothing is removed."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=1)  # One record per segment.
    positions = [await writer.write(b"r%d" % i) for i in range(4)]
    await writer.close()
    before = await ns.stream_metadata("s")
    for seq in (5, 40, -1):
        with pytest.raises(
            InvalidStreamArgumentError,
            match=rf"^stream tenant/s: truncate before seq {seq} is outside the stream "
            r"\(next seq 4\): give a seq in \[0, 4\]; 4 removes every sealed segment$",
        ):
            await ns.truncate("s", before=StreamPosition(positions[-1].ledger_id, 0, seq))
    assert await ns.stream_metadata("s") == before
    result = await ns.truncate("s", before=positions[2])
    assert result.first_seq == 2
    everything = await ns.truncate("s", before=StreamPosition(0, 0, 4))  # The next seq.
    assert everything.first_seq == 4 and (await ns.stream_metadata("s")).segments == ()


async def test_truncating_past_the_acknowledged_end_of_an_open_stream_is_refused(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    sealing = await ns.open_writer("s", roll_bytes=1)
    for i in range(2):
        await sealing.write(b"r%d" % i)
    await sealing.close()
    writer = await ns.open_writer("s")  # Sealed segments, then an open one.
    last = await writer.write(b"r2")
    before = await ns.stream_metadata("s")
    assert before.open_segment is not None and before.open_segment.first_seq == last.seq
    end = last.seq + 1
    with pytest.raises(
        InvalidStreamArgumentError, match=rf"before seq {end * 10} .*\(next seq {end}\)"
    ):
        await ns.truncate("s", before=StreamPosition(0, 0, end * 10))
    assert await ns.stream_metadata("s") == before
    assert (await ns.truncate("s", before=StreamPosition(0, 0, end))).first_seq == last.seq
    await writer.close()


async def test_the_cli_refuses_a_truncation_past_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bkaio stream truncate --before SEQ` judges the seq as the API does (no bookie needed)."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    await initialise_cluster_at(uri)

    def bkaio(*args: str) -> tuple[int, str]:
        code = main(["stream", *args, "--metadata", uri])
        return code, capsys.readouterr().err

    # main() runs its own event loop: off this test's loop, as the console script would.
    assert await asyncio.to_thread(bkaio, "create", "ns") == (0, "")
    assert await asyncio.to_thread(bkaio, "create", "ns/s") == (0, "")
    assert await asyncio.to_thread(bkaio, "truncate", "ns/s", "--before", "0") == (0, "")
    code, err = await asyncio.to_thread(bkaio, "truncate", "ns/s", "--before", "10")
    assert (code, err.splitlines()) == (
        1,
        [
            "bkaio: InvalidStreamArgumentError: stream ns/s: truncate before seq 10 is outside "
            "the stream (next seq 0): give a seq in [0, 0]; 0 removes every sealed segment"
        ],
    )


async def test_a_start_whose_ledger_is_not_the_streams_is_refused(
    make_client: ClientFactory,
) -> None:
    """A position of another stream (or a mistyped ledger or entry) started wherever its seq
    fell in this one; now it is refused, naming this stream's position at that seq."""
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    written: dict[str, list[StreamPosition]] = {}
    for name in ("a", "b"):
        writer = await ns.open_writer(name, roll_bytes=4)  # Two records per segment.
        written[name] = [await writer.write(b"r%d" % i) for i in range(6)]
        await writer.close()
    a, b = written["a"], written["b"]
    assert b[3].ledger_id != a[3].ledger_id and b[3].seq == a[3].seq
    assert a[1].ledger_id != a[2].ledger_id  # A segment ends at seq 1.
    mistakes = [
        b[3],  # Another stream's.
        StreamPosition(a[0].ledger_id, 3, 3),  # Seq 3 is not in that ledger.
        StreamPosition(a[3].ledger_id, 0, 3),  # The right ledger, the wrong entry.
    ]
    for start in mistakes:
        with pytest.raises(
            InvalidStreamArgumentError,
            match=rf"^stream tenant/a: start {start} is not a position of this stream .*"
            rf": seq 3 is at {a[3]} in it",
        ):
            await ns.open_reader("a", start=start)
    async with await ns.open_reader("a", start=a[3]) as reader:
        assert [r.position for r in await take(reader, 3)] == a[3:]
    # One past the last entry of a sealed segment (a resume point made from the record
    # before) names the next segment's first record.
    after = StreamPosition(a[1].ledger_id, a[1].entry_id + 1, a[1].seq + 1)
    async with await ns.open_reader("a", start=after) as reader:
        assert [r.position for r in await take(reader, 1)] == [a[2]]


async def test_the_cli_refuses_a_start_from_another_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bkaio stream tail --from L:E@S` judges the ledger as the API does, and `--from SEQ` at
    the next seq of a sealed stream is still a good start (no bookie is needed for either)."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    await initialise_cluster_at(uri)

    def bkaio(*args: str) -> tuple[int, str]:
        code = main(["stream", *args, "--metadata", uri])
        return code, capsys.readouterr().err

    assert await asyncio.to_thread(bkaio, "create", "ns") == (0, "")
    assert await asyncio.to_thread(bkaio, "create", "ns/s") == (0, "")
    metadata = await open_metadata(uri)
    try:
        store = StreamStore(metadata)
        meta = await store.get_stream("ns", "s")
        closed = SegmentState.CLOSED
        segments = (Segment(7, 0, 2, closed, 1, 2, 6), Segment(9, 3, 4, closed, 3, 4, 4))
        await store.put_stream("ns", "s", replace(meta, segments=segments))
    finally:
        await metadata.close()
    code, err = await asyncio.to_thread(bkaio, "tail", "ns/s", "--from", "8:1@4", "--no-follow")
    assert (code, err.splitlines()) == (
        1,
        [
            "bkaio: InvalidStreamArgumentError: stream ns/s: start 8:1@4 is not a position of "
            "this stream (from another stream, or mistyped?): seq 4 is at 9:1@4 in it; give that "
            "position, or the seq alone where a seq is taken"
        ],
    )
    assert await asyncio.to_thread(bkaio, "tail", "ns/s", "--from", "5", "--no-follow") == (0, "")
    assert await asyncio.to_thread(bkaio, "tail", "ns/s", "--from", "9:2@5", "--no-follow") == (
        0,
        "",
    )
