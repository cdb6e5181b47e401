"""The stream layer's pure parts: positions, records and their codecs, segment policy."""

from __future__ import annotations

import pytest

from bkaio.meta.errors import InvalidMetadataError
from bkaio.stream.errors import InvalidStreamArgumentError
from bkaio.stream.model import (
    CursorState,
    NamespaceSettings,
    Segment,
    SegmentState,
    StreamMeta,
    StreamPosition,
    retention_count,
    truncated,
    truncation_count,
)

CLOSED = SegmentState.CLOSED
OPEN = SegmentState.OPEN


def closed(ledger_id: int, first: int, last: int, closed_ms: int = 0, size: int = 0) -> Segment:
    return Segment(ledger_id, first, last, CLOSED, 0, closed_ms, size)


def stream(*segments: Segment, first_seq: int = 0) -> StreamMeta:
    return StreamMeta(epoch=1, first_seq=first_seq, segments=segments)


def test_positions_order_by_seq_even_when_ledger_ids_do_not_grow() -> None:
    early = StreamPosition(ledger_id=2000, entry_id=5, seq=5)
    late = StreamPosition(ledger_id=7, entry_id=0, seq=6)
    assert early < late and late > early and early <= early
    assert sorted([late, early]) == [early, late]


def test_position_text_round_trips_and_bad_text_says_the_format() -> None:
    position = StreamPosition(12, 3, 4000)
    assert StreamPosition.parse(str(position)) == position
    with pytest.raises(InvalidStreamArgumentError, match="LEDGER:ENTRY@SEQ"):
        StreamPosition.parse("12-3")


def test_stream_record_round_trips_through_its_dict_form() -> None:
    meta = stream(
        closed(1, 0, 9, 5, 100),
        closed(2, 10, 9),  # Sealed empty.
        Segment(3, 10, -1, OPEN, 7),
    )
    again = StreamMeta.from_dict("s", meta.to_dict(), version=42)
    assert again.segments == meta.segments and again.version == 42 and again.epoch == 1


@pytest.mark.parametrize(
    "segments",
    [
        (closed(1, 0, 9), closed(2, 11, 20)),  # Gap.
        (Segment(1, 0, -1, OPEN, 0), closed(2, 0, 5)),  # Open before the end.
    ],
)
def test_segments_that_do_not_tile_the_seq_space_are_refused(segments: tuple[Segment, ...]) -> None:
    with pytest.raises(InvalidMetadataError):
        StreamMeta(segments=segments)


def test_unknown_record_format_is_refused_not_misread() -> None:
    value = stream().to_dict() | {"format": 99}
    with pytest.raises(InvalidMetadataError, match="format 99"):
        StreamMeta.from_dict("s", value, 1)


def test_segment_lookup_skips_empty_segments_and_reaches_into_the_open_one() -> None:
    meta = stream(closed(1, 0, 9), closed(2, 10, 9), Segment(3, 10, -1, OPEN, 0))
    assert meta.segment_index_for(0) == 0
    assert meta.segment_index_for(9) == 0
    assert meta.segment_index_for(10) == 2
    assert meta.segment_index_for(10_000) == 2
    assert stream(closed(1, 0, 9)).segment_index_for(10) is None


def test_truncation_removes_whole_sealed_segments_only() -> None:
    meta = stream(closed(1, 0, 9), closed(2, 10, 19), Segment(3, 20, -1, OPEN, 0))
    assert truncation_count(meta.segments, 5) == 0
    assert truncation_count(meta.segments, 10) == 1
    assert truncation_count(meta.segments, 10_000) == 2  # Never the open segment.
    after = truncated(meta, 2)
    assert after.first_seq == 20 and [s.ledger_id for s in after.segments] == [3]


def test_retention_by_age_and_size_stops_at_the_slowest_cursor() -> None:
    segments = [closed(i, i * 10, i * 10 + 9, closed_ms=i * 1000, size=100) for i in range(5)]
    by_age = retention_count(
        segments, now_ms=10_000, retention_seconds=7.5, retention_bytes=None, keep_from_seq=None
    )
    assert by_age == 3  # Sealed at 0, 1000, 2000 ms: older than 2500 ms.
    by_size = retention_count(
        segments, now_ms=0, retention_seconds=None, retention_bytes=250, keep_from_seq=None
    )
    assert by_size == 3  # 500 bytes -> keep the newest 200.
    held = retention_count(
        segments, now_ms=10_000, retention_seconds=1, retention_bytes=None, keep_from_seq=15
    )
    assert held == 1  # The cursor still needs seq 15 (segment 1).


def test_namespace_settings_validate_and_round_trip() -> None:
    settings = NamespaceSettings(quota_bytes=10, max_streams=2, rack_labels=("/r1",))
    again = NamespaceSettings.from_dict("ns", settings.to_dict(), 3)
    assert again == settings and again.version == 3
    with pytest.raises(InvalidStreamArgumentError, match="quota_bytes"):
        NamespaceSettings(quota_bytes=0)
    with pytest.raises(InvalidStreamArgumentError, match="ack_quorum"):
        NamespaceSettings(ensemble_size=2, write_quorum=3)


def test_cursor_state_round_trips() -> None:
    state = CursorState(StreamPosition(4, 2, 17), 123)
    assert CursorState.from_dict("c", state.to_dict()) == state
    with pytest.raises(InvalidMetadataError):
        CursorState.from_dict("c", {"format": 1, "seq": 1})
