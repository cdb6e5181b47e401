"""Entry-log files, the LMDB index, checkpoint marks and config validation, piece by piece."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.entrylog.checkpoint import (
    AppliedMarks,
    decode_marks,
    encode_marks,
    read_last_mark,
    write_last_mark,
)
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.entry_log import (
    LOG_HEADER,
    EntryLocation,
    EntryLogDirectory,
    decode_record,
    encode_record,
)
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.types import LedgerState
from bkaio.errors import BookieIOError, ConfigError
from bkaio.journal.config import JournalConfig
from bkaio.journal.records import JournalMark
from tests.unit.entrylog.conftest import make_entry


def test_record_round_trip_and_corruption_is_detected() -> None:
    entry = make_entry(2**62, 7, payload=b"payload")
    record = encode_record(entry)
    assert decode_record(record, where="t") == entry
    damaged = bytearray(record)
    damaged[-1] ^= 0xFF
    with pytest.raises(BookieIOError, match="checksum"):
        decode_record(bytes(damaged), where="t")
    with pytest.raises(BookieIOError, match="short"):
        decode_record(record[:10], where="t")


def test_entry_logs_roll_by_size_and_read_back(tmp_path: Path) -> None:
    logs = EntryLogDirectory(tmp_path, max_log_bytes=1024)
    logs.open()
    entries = [make_entry(1, i, payload=bytes([i]) * 200) for i in range(20)]
    locations = logs.append([encode_record(e) for e in entries])
    logs.sync()
    assert len({loc.log_id for loc in locations}) > 3  # Rolled.
    assert all(loc.offset + loc.size <= 1024 for loc in locations)
    assert [logs.read(loc) for loc in locations] == entries
    first = locations[0].log_id
    assert [entry for _loc, entry in logs.scan(first)] == [
        e for e, loc in zip(entries, locations, strict=True) if loc.log_id == first
    ]
    assert logs.remove(first) > LOG_HEADER.size
    assert logs.read(locations[0]) is None  # Removed: the caller looks it up again.
    logs.close()
    reopened = EntryLogDirectory(tmp_path, max_log_bytes=1024)
    reopened.open()  # A new current log after every existing one.
    assert reopened.current_log_id == max(loc.log_id for loc in locations) + 1
    assert reopened.read(locations[-1]) == entries[-1]
    reopened.close()


@pytest.mark.parametrize("sync_bytes", [0, 500])
def test_append_synced_writes_what_append_writes_and_indexes_it(
    tmp_path: Path, sync_bytes: int
) -> None:
    """The flush's one-pass `append_synced`: the same bytes as `encode_record` + `append`
    (in the same places, rolling by size), packed locations the index takes as they are."""
    entries = [make_entry(3, i, payload=bytes([i]) * (50 + 13 * i)) for i in range(30)]
    by_append = EntryLogDirectory(tmp_path / "a", max_log_bytes=1024)
    by_append.open()
    expected = by_append.append([encode_record(e) for e in entries])
    by_append.sync()
    synced = EntryLogDirectory(tmp_path / "b", max_log_bytes=1024)
    synced.open()
    packed = synced.append_synced(entries, sync_bytes)
    assert [EntryLocation.unpack(p) for p in packed] == expected
    assert len({loc.log_id for loc in expected}) > 3  # Rolled.
    assert [synced.read(loc) for loc in expected] == entries
    for log_id in {loc.log_id for loc in expected}:
        name = f"{log_id:08x}.log"
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
    assert synced.append_synced([]) == []  # Nothing to write; still syncs.
    index = LedgerIndex(tmp_path / "index", map_bytes=1 << 24)
    index.commit_entries(entries, packed, [])
    assert [index.get(3, e.entry_id) for e in entries] == expected
    index.close()
    by_append.close()
    synced.close()


def test_scan_stops_at_a_torn_tail(tmp_path: Path) -> None:
    logs = EntryLogDirectory(tmp_path, max_log_bytes=1 << 20)
    logs.open()
    entries = [make_entry(1, i) for i in range(3)]
    locations = logs.append([encode_record(e) for e in entries])
    logs.close()
    path = tmp_path / "00000000.log"
    path.write_bytes(path.read_bytes()[:-5])
    reopened = EntryLogDirectory(tmp_path, max_log_bytes=1 << 20)
    reopened.open()
    assert [entry for _loc, entry in reopened.scan(locations[0].log_id)] == entries[:2]
    reopened.close()


def test_index_locations_states_and_floor_seek(tmp_path: Path) -> None:
    index = LedgerIndex(tmp_path, map_bytes=1 << 24)
    state = LedgerState(5, True, b"key", 3, 2, 9)
    index.commit(
        [(5, e, EntryLocation(1, 16 + e * 10, 10)) for e in (0, 1, 2, 4, 9)]
        + [(6, 0, EntryLocation(1, 0, 1)), (4, 100, EntryLocation(1, 0, 1))],
        [state],
    )
    assert index.get(5, 4) == EntryLocation(1, 56, 10)
    assert index.get(5, 3) is None
    assert len(index.get_run(5, 0, 100)) == 3
    assert len(index.get_run(5, 1, 1)) == 1
    assert index.get_run(5, 3, 10) == []
    assert index.last_entry_id(5) == 9
    assert index.last_entry_id(6) == 0
    assert index.last_entry_id(7) == -1
    assert index.entry_ids(5) == [0, 1, 2, 4, 9]
    assert index.states() == {5: state}
    old, new = EntryLocation(1, 16, 10), EntryLocation(2, 16, 10)
    assert index.move_locations([(5, 0, old, new), (5, 1, old, new)]) == 1  # 5/1 moved already.
    assert index.get(5, 0) == new
    assert index.delete_ledger(5) == 5
    assert index.entry_ids(5) == [] and index.states() == {}
    assert index.delete_ledger(6) == 1  # The last ledger in the store.
    assert [lid for lid, _e, _loc in index.all_locations()] == [4]
    index.close()


def test_last_mark_files(tmp_path: Path) -> None:
    marks: list[JournalMark | None] = [JournalMark(3, 4096), None]
    assert decode_marks(encode_marks(marks)) == [JournalMark(3, 4096), JournalMark(0, 0)]
    assert decode_marks(encode_marks(marks)[:-1]) is None
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert read_last_mark([first, second], 2) == [None, None]
    write_last_mark(first, marks)
    write_last_mark(second, [JournalMark(2, 10), JournalMark(1, 20)])
    assert read_last_mark([first, second], 2) == [JournalMark(3, 4096), JournalMark(1, 20)]
    (first / "lastMark").write_bytes(b"torn")
    assert read_last_mark([first, second], 2) == [JournalMark(2, 10), JournalMark(1, 20)]


def test_applied_marks_only_claim_a_contiguous_prefix() -> None:
    marks = AppliedMarks(None)
    first, second, third = marks.begin(), marks.begin(), marks.begin()
    marks.finish(second, JournalMark(1, 200))
    assert marks.applied is None  # The first is durable but not applied yet.
    marks.finish(first, JournalMark(1, 100))
    assert marks.applied == JournalMark(1, 200)
    marks.finish(third, None)  # Failed appends do not hold the prefix back.
    assert marks.applied == JournalMark(1, 200) and marks.in_flight == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"index_dirs": ()}, "one index dir per ledger dir"),
        ({"ledger_dirs": (), "index_dirs": ()}, "at least one disk"),
        ({"write_cache_bytes": 0}, "write_cache_bytes"),
        ({"entry_log_max_bytes": 1 << 32}, "entry_log_max_bytes"),
        ({"compaction_threshold": 1.5}, "compaction_threshold"),
        ({"disk_warn_fraction": 0.99}, "disk_warn_fraction"),
        ({"flush_interval_seconds": 0}, "flush_interval_seconds"),
        ({"index_dirs": (Path("/l0"),)}, "distinct"),
    ],
)
def test_config_validation(change: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {
        "journal": JournalConfig(directories=(Path("/j"),)),
        "ledger_dirs": (Path("/l0"),),
        "index_dirs": (Path("/i0"),),
    }
    fields.update(change)
    with pytest.raises(ConfigError, match=message):
        StorageConfig(**fields)  # type: ignore[arg-type]
