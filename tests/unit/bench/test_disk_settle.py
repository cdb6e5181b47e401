"""The between-runs disk settle: /proc/diskstats parsing and what counts as quiet."""

from __future__ import annotations

from pathlib import Path

from bkaio.bench.disk_settle import DiskActivity, parse_diskstats, physical_devices

# A 6.x kernel's lines (20 columns): a disk, its partition, a loop device.
DISKSTATS = """\
 253       0 vda 1000 5 80000 900 2000 30 64000 4000 3 5000 9000 40 0 8000 70 500 60
 253       1 vda1 990 5 79000 890 1990 30 63000 3990 3 4990 8990 40 0 8000 70 0 0
   7       0 loop0 50 0 400 10 7 0 56 1 0 11 11 0 0 0 0 0 0
"""

# A kernel before 4.18: no discard columns.
OLD_DISKSTATS = " 8       0 sda 10 0 80 1 20 0 160 2 1 3 4\n"


def test_sums_only_the_named_whole_devices() -> None:
    activity = parse_diskstats(DISKSTATS, frozenset({"vda"}))
    assert activity == DiskActivity(writes=2000, discards=40, in_flight=3)


def test_old_kernels_have_no_discard_counts() -> None:
    activity = parse_diskstats(OLD_DISKSTATS, frozenset({"sda"}))
    assert activity == DiskActivity(writes=20, discards=0, in_flight=1)


def test_unknown_devices_and_short_lines_count_nothing() -> None:
    activity = parse_diskstats(DISKSTATS + "garbage\n", frozenset({"nvme0n1"}))
    assert activity == DiskActivity(writes=0, discards=0, in_flight=0)


def test_quiet_needs_no_new_writes_no_new_discards_and_nothing_in_flight() -> None:
    before = DiskActivity(writes=10, discards=2, in_flight=0)
    assert DiskActivity(writes=10, discards=2, in_flight=0).quiet_since(before)
    assert not DiskActivity(writes=11, discards=2, in_flight=0).quiet_since(before)
    assert not DiskActivity(writes=10, discards=3, in_flight=0).quiet_since(before)  # Trimming.
    assert not DiskActivity(writes=10, discards=2, in_flight=1).quiet_since(before)


def test_physical_devices_skip_virtual_ones(tmp_path: Path) -> None:
    for name in ("vda", "nvme0n1", "loop0", "ram1", "zram0"):
        (tmp_path / name).mkdir()
    assert physical_devices(tmp_path) == frozenset({"vda", "nvme0n1"})
    assert physical_devices(tmp_path / "missing") == frozenset()
