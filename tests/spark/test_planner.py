"""Partition planning, offset limits and option parsing of the Spark connector, without Spark."""

from __future__ import annotations

import dataclasses

import pytest

from bkaio.ledger_client.types import ClientConfig
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import (
    EARLIEST,
    EARLIEST_SEQ,
    LATEST,
    parse_offsets,
    parse_read_options,
    parse_write_options,
)
from bkaio.spark.planner import (
    ReadRange,
    limit_offsets,
    plan_partitions,
    split_ranges,
    stream_ranges,
)
from bkaio.spark.sink import WrittenLedger, appended
from bkaio.stream.model import Segment, SegmentState, StreamMeta

URI = "sqlite:///tmp/meta.db"


def closed(ledger_id: int, first_seq: int, count: int, size: int) -> Segment:
    return Segment(ledger_id, first_seq, first_seq + count - 1, SegmentState.CLOSED, 0, 0, size)


def open_segment(ledger_id: int, first_seq: int) -> Segment:
    return Segment(ledger_id, first_seq, -1, SegmentState.OPEN, 0)


def covered(ranges: list[ReadRange]) -> list[tuple[int, int, int]]:
    """(ledger, entry, seq) of every entry the ranges cover, in order."""
    return [
        (r.ledger_id, e, r.first_seq + e - r.first_entry_id)
        for r in ranges
        for e in range(r.first_entry_id, r.last_entry_id + 1)
    ]


SEGMENTS = (closed(7, 0, 100, 1000), closed(9, 100, 0, 0), closed(4, 100, 50, 5000))


def test_stream_ranges_map_seqs_onto_segments_and_skip_empty_ones() -> None:
    ranges = stream_ranges("ns/s", (*SEGMENTS, open_segment(12, 150)), 90, 160, b"pw")
    assert [(r.ledger_id, r.first_entry_id, r.last_entry_id, r.first_seq) for r in ranges] == [
        (7, 90, 99, 90),
        (4, 0, 49, 100),
        (12, 0, 9, 150),
    ]
    assert ranges[0].bytes_estimate == 100  # 10 of 100 entries of a 1000-byte segment.
    assert ranges[2].bytes_estimate == 0  # Open: unknown.
    assert covered(ranges) == [
        (lid, seq - first, seq)
        for seq in range(90, 160)
        for lid, first in [(7, 0) if seq < 100 else (4, 100) if seq < 150 else (12, 150)]
    ]


def test_stream_ranges_empty_when_end_not_after_start() -> None:
    assert stream_ranges("ns/s", SEGMENTS, 120, 120, b"") == []
    assert stream_ranges("ns/s", SEGMENTS, 140, 100, b"") == []


@pytest.mark.parametrize("max_entries", [1, 7, 33, 100, 1000])
def test_split_by_entries_covers_everything_once_within_the_limit(max_entries: int) -> None:
    ranges = stream_ranges("ns/s", SEGMENTS, 0, 150, b"")
    pieces = split_ranges(ranges, max_entries=max_entries, max_bytes=1 << 30)
    assert covered(pieces) == covered(ranges)
    assert all(p.entry_count <= max_entries for p in pieces)
    assert sum(p.bytes_estimate for p in pieces) == sum(r.bytes_estimate for r in ranges)


def test_split_by_bytes_uses_the_estimate() -> None:
    ranges = stream_ranges("ns/s", SEGMENTS, 0, 150, b"")  # 1000 B / 100 and 5000 B / 50.
    pieces = split_ranges(ranges, max_entries=10_000, max_bytes=1000)
    assert [(p.ledger_id, p.entry_count) for p in pieces] == [(7, 100)] + [(4, 10)] * 5
    assert covered(pieces) == covered(ranges)


@pytest.mark.parametrize("min_partitions", [0, 1, 2, 5, 151, 400])
def test_min_partitions_splits_the_largest(min_partitions: int) -> None:
    ranges = stream_ranges("ns/s", SEGMENTS, 0, 150, b"")
    pieces = split_ranges(
        ranges, max_entries=10_000, max_bytes=1 << 30, min_partitions=min_partitions
    )
    assert len(pieces) == max(2, min(min_partitions, 150))
    assert covered(pieces) == covered(ranges)


def test_raw_ledger_ranges_keep_a_null_seq_when_split() -> None:
    pieces = split_ranges([ReadRange(None, 3, 0, 9, -1)], max_entries=4, max_bytes=1 << 30)
    assert [(p.first_entry_id, p.last_entry_id, p.first_seq) for p in pieces] == [
        (0, 2, -1),
        (3, 5, -1),
        (6, 9, -1),
    ]


def many_small_segments(count: int, records: int) -> list[Segment]:
    return [closed(100 + i, i * records, records, records * 10) for i in range(count)]


def test_small_ledgers_share_partitions_up_to_the_size() -> None:
    ranges = stream_ranges("ns/s", many_small_segments(50, 20), 0, 1000, b"")
    partitions = plan_partitions(ranges, max_entries=300, max_bytes=1 << 30)
    assert [sum(r.entry_count for r in p) for p in partitions] == [300, 300, 300, 100]
    assert covered([r for p in partitions for r in p]) == covered(ranges)  # In seq order.
    by_bytes = plan_partitions(ranges, max_entries=10_000, max_bytes=1000)
    assert [sum(r.bytes_estimate for r in p) for p in by_bytes] == [1000] * 10


def test_a_large_range_is_split_and_its_pieces_not_gathered_again() -> None:
    ranges = [ReadRange("ns/s", 5, 0, 999, 0, 0), ReadRange("ns/s", 6, 0, 9, 1000, 0)]
    partitions = plan_partitions(ranges, max_entries=400, max_bytes=1 << 30)
    assert [[(r.ledger_id, r.entry_count) for r in p] for p in partitions] == [
        [(5, 333)],
        [(5, 333)],
        [(5, 334), (6, 10)],
    ]


@pytest.mark.parametrize("min_partitions", [0, 1, 2, 3, 7, 50, 1001, 5000])
def test_min_partitions_halves_the_largest_partition(min_partitions: int) -> None:
    ranges = stream_ranges("ns/s", many_small_segments(50, 20), 0, 1000, b"")
    partitions = plan_partitions(
        ranges, max_entries=10_000, max_bytes=1 << 30, min_partitions=min_partitions
    )
    assert len(partitions) == max(1, min(min_partitions, 1000))
    assert covered([r for p in partitions for r in p]) == covered(ranges)
    sizes = [sum(r.entry_count for r in p) for p in partitions]
    assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1  # About even.


def test_no_ranges_no_partitions() -> None:
    assert plan_partitions([], max_entries=10, max_bytes=10, min_partitions=4) == []


def test_limit_offsets_shares_the_budget_and_always_progresses() -> None:
    start = {"a/x": 0, "a/y": 100}
    end = {"a/x": 1000, "a/y": 200, "a/z": 5}  # z is new: start defaults to end (no backlog).
    assert limit_offsets(start, end, max_entries=None, max_bytes=None) == end
    limited = limit_offsets(start, end, max_entries=110, max_bytes=None)
    assert limited == {"a/x": 100, "a/y": 110, "a/z": 5}
    assert limit_offsets(start, end, max_entries=1, max_bytes=None) == {
        "a/x": 1,
        "a/y": 101,
        "a/z": 5,
    }
    by_bytes = limit_offsets(
        start, end, max_entries=None, max_bytes=1100, entry_bytes={"a/x": 1.0, "a/y": 100.0}
    )
    assert by_bytes == {"a/x": 100, "a/y": 110, "a/z": 5}


def test_read_options_parse_and_validate() -> None:
    options = parse_read_options(
        {
            "Metadata": URI,
            "streams": "a/x, b/y",
            "startingOffsets": '{"a/x": 5, "b/y": {"ledgerId": 3, "entryId": 2}}',
            "maxEntriesPerPartition": "10",
            "minPartitions": "4",
            "failOnDataLoss": "false",
            "bkaio.client.read_timeout": "2.5",
        },
        streaming=False,
    )
    assert options.streams == ("a/x", "b/y")
    assert options.starting == {"a/x": 5, "b/y": (3, 2)}
    assert options.ending == LATEST
    assert (options.max_entries_per_partition, options.min_partitions) == (10, 4)
    assert options.fail_on_data_loss is False
    assert options.client["read_timeout"] == 2.5
    path = parse_read_options({"metadata": URI, "path": "a/x"}, streaming=True)
    assert (path.streams, path.starting) == (("a/x",), EARLIEST)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "a/x"}, "'metadata' is required"),
        ({"metadata": URI}, "exactly one of"),
        ({"metadata": URI, "stream": "a/x", "ledgers": "1"}, "exactly one of"),
        ({"metadata": URI, "stream": "nosslash"}, "not 'namespace/stream'"),
        ({"metadata": URI, "stream": "a/x", "colour": "red"}, "unknown option"),
        ({"metadata": URI, "ledgers": "1,x"}, "comma-separated"),
        ({"metadata": URI, "stream": "a/x", "minPartitions": "-1"}, "must be >= 0"),
        ({"metadata": URI, "stream": "a/x", "startingOffsets": "{"}, "neither earliest"),
        ({"metadata": URI, "stream": "a/x", "startingOffsets": '{"a/x": -3}'}, "seq -3"),
        ({"metadata": URI, "stream": "a/x", "failOnDataLoss": "maybe"}, "true or false"),
        ({"metadata": URI, "stream": "a/x", "bkaio.client.nope": "1"}, "not a client setting"),
        ({"metadata": URI, "streamsPattern": "(", "x": "1"}, "unknown option"),
        ({"metadata": URI, "streamsPattern": "("}, "streamsPattern"),
    ],
)
def test_bad_read_options_say_what_is_wrong(options: dict[str, str], message: str) -> None:
    with pytest.raises(SparkOptionError, match=message):
        parse_read_options(options, streaming=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ledgers": "9223372036854775808"}, r"9223372036854775808 outside \[0, 2\*\*63 - 1\]"),
        ({"ledgers": "4,-1"}, r"-1 outside \[0"),
        ({"ledgers": "1,2,1,1,3,2"}, "1, 2 given more than once"),
        ({"ledgers": " , "}, "no ledger id"),
        ({"stream": "a/x", "password": "pw"}, "stream password"),
        ({"streamsPattern": "a/.*", "password": ""}, "raw ledgers only"),
    ],
)
def test_bad_ledgers_and_password_options_say_what_is_wrong(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(SparkOptionError, match=message):
        parse_read_options({"metadata": URI, **options}, streaming=False)


def test_ledger_options_take_the_largest_id_and_a_password() -> None:
    options = parse_read_options(
        {"metadata": URI, "ledgers": f"0, {2**63 - 1}", "password": "pw"}, streaming=False
    )
    assert (options.ledgers, options.password) == ((0, 2**63 - 1), b"pw")


def test_client_options_take_the_type_a_field_declares_not_its_defaults() -> None:
    options = parse_read_options(
        {
            "metadata": URI,
            "stream": "a/x",
            "bkaio.client.auth_token": "12345",  # str | None, default None: stays a string.
            "bkaio.client.speculative_read_timeout": "0.25",
            "bkaio.client.read_ahead_entries_per_second": "None",
            "bkaio.client.sticky_reads": "false",
            "bkaio.client.read_batch_entries": "64",
        },
        streaming=False,
    )
    assert options.client == {
        "auth_token": "12345",
        "speculative_read_timeout": 0.25,
        "read_ahead_entries_per_second": None,
        "sticky_reads": False,
        "read_batch_entries": 64,
    }
    token = parse_read_options(
        {"metadata": URI, "stream": "a/x", "bkaio.client.auth_token": "s3cret"}, streaming=False
    )
    assert token.client == {"auth_token": "s3cret"}


def test_every_client_field_parses_from_its_default_as_text() -> None:
    given = {
        f"bkaio.client.{f.name}": str(f.default)
        for f in dataclasses.fields(ClientConfig)
        if f.default is not None
    }
    options = parse_write_options({"metadata": URI, "stream": "a/out", **given})
    defaults = {f.name: f.default for f in dataclasses.fields(ClientConfig)}
    for name, value in options.client.items():
        assert (value, type(value)) == (defaults[name], type(defaults[name])), name


@pytest.mark.parametrize(
    ("client", "message"),
    [
        ({"read_batch_entries": "0"}, r"bkaio\.client\.read_batch_entries: .*must be >= 1"),
        ({"read_batch_entries": "1.5"}, r"read_batch_entries='1.5' is not an integer"),
        ({"read_timeout": "soon"}, r"read_timeout='soon' is not a number"),
        ({"explicit_lac_interval": "nan"}, r"explicit_lac_interval='nan' is not a number"),
        ({"speculative_read_timeout": "x"}, r"timeout='x' is not a number \(or none\)"),
        ({"speculative_read_timeout": "-1"}, r"bkaio\.client\.speculative_read_timeout: "),
        ({"reconnect_backoff_max": "0.01"}, r"\.reconnect_backoff_max: reconnect_backoff_min"),
        ({"sticky_reads": "maybe"}, "true or false"),
    ],
)
def test_bad_client_options_fail_when_parsed_naming_the_option(
    client: dict[str, str], message: str
) -> None:
    given = {f"bkaio.client.{name}": value for name, value in client.items()}
    with pytest.raises(SparkOptionError, match=message):
        parse_read_options({"metadata": URI, "stream": "a/x", **given}, streaming=False)
    with pytest.raises(SparkOptionError, match=message):
        parse_write_options({"metadata": URI, "stream": "a/out", **given})


def test_streaming_refuses_ledgers_and_ending_offsets() -> None:
    with pytest.raises(SparkOptionError, match="raw ledgers"):
        parse_read_options({"metadata": URI, "ledgers": "1"}, streaming=True)
    with pytest.raises(SparkOptionError, match="batch reads only"):
        parse_read_options(
            {"metadata": URI, "stream": "a/x", "endingOffsets": "latest"}, streaming=True
        )


def test_offsets_accept_kafka_style_sentinels() -> None:
    assert parse_offsets('{"a/x": -2, "a/y": {"seq": 4}}', "k", LATEST) == {
        "a/x": EARLIEST_SEQ,
        "a/y": 4,
    }
    assert parse_offsets(None, "k", LATEST) == LATEST
    assert parse_offsets(" Earliest ", "k", LATEST) == EARLIEST


def test_write_options() -> None:
    options = parse_write_options({"metadata": URI, "stream": "a/out", "ackQuorum": "1"})
    assert (options.namespace, options.stream, options.ack_quorum) == ("a", "out", 1)
    with pytest.raises(SparkOptionError, match="'stream'"):
        parse_write_options({"metadata": URI})


def test_sink_appends_sealed_segments_in_task_order_and_bumps_the_epoch() -> None:
    meta = StreamMeta(epoch=3, segments=(closed(7, 0, 100, 1000),))
    target = appended(meta, [WrittenLedger(20, 9, 90), WrittenLedger(21, 0, 5)], 42)
    assert target.epoch == 4
    assert [(s.ledger_id, s.first_seq, s.last_seq, s.bytes) for s in target.segments] == [
        (7, 0, 99, 1000),
        (20, 100, 109, 90),
        (21, 110, 110, 5),
    ]
    assert target.open_segment is None
