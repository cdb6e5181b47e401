"""A shard's read-only thresholds against what the bookie can still write.

A file system keeps blocks for root (ext4: 5% by default), which an unprivileged bookie cannot
write: its disk is full when the blocks available to it (`statvfs` f_bavail, `free`) run out,
while `used / total` still shows 95%. Usage is therefore `df`'s Use%, `used / (used + free)`,
which is 100% then; counted as `used / total`, a journal disk filled up before the shard
turned read-only, and a journal write that fails ends the bookie.

In process: real `ShardStorage` whose `usage_function` (the Disk seam's `usage`) reports a file
system with reserved blocks, and a `ShardServer` on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog

from bkaio.bookie.metrics import ShardMetrics
from bkaio.bookie.server import ShardServer
from bkaio.config import load_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.journal import open_journal
from bkaio.journal.disk import DiskSpace

TOTAL = 1_000_000
RESERVED = TOTAL // 20  # ext4's default: 5% for root.


class ReservedBlocksDisk:
    """A file system of TOTAL bytes, RESERVED of them for root, `used` taken."""

    def __init__(self) -> None:
        self.used = TOTAL // 2

    def usage(self, path: Path) -> DiskSpace:
        del path
        return DiskSpace(TOTAL, self.used, max(TOTAL - RESERVED - self.used, 0))


@pytest.fixture
async def disk_and_server(tmp_path: Path) -> AsyncIterator[tuple[ReservedBlocksDisk, ShardServer]]:
    config_path = tmp_path / "bookie.toml"
    config_path.write_text(
        '[bookie]\nhost = "127.0.0.1"\nport = 3181\nshards = 1\n'
        f'[metadata]\nuri = "sqlite://{tmp_path}/meta.db"\n'
        f'[storage]\njournal_dirs = ["{tmp_path}/journal"]\nledger_dirs = ["{tmp_path}/data"]\n'
        "[journal]\nsync = false\n"
    )
    config = load_bookie_config(config_path, env={})
    disk = ReservedBlocksDisk()
    storage = await ShardStorage.open(
        config.storage[0],
        bookie_id="test",
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
        usage_function=disk.usage,
    )
    try:
        yield disk, ShardServer(config, 0, storage, ShardMetrics())
    finally:
        await storage.close()


async def test_a_disk_whose_available_blocks_run_out_turns_the_shard_read_only(
    disk_and_server: tuple[ReservedBlocksDisk, ShardServer],
) -> None:
    disk, server = disk_and_server
    server.apply_disk_usage(server.measure_disk_usage())
    assert not server.read_only
    # 1% of the disk left to the bookie: 98.9% used as the bookie (and df) sees it, 94% as
    # used / total: past disk_read_only_fraction (0.95).
    disk.used = TOTAL - RESERVED - TOTAL // 100
    usages = server.measure_disk_usage()
    server.apply_disk_usage(usages)
    assert server.read_only and server.disk_full
    assert all(usage.fraction == pytest.approx(940 / 950) for usage in usages)
    # Room again: below disk_writable_fraction (0.90) as the bookie sees it.
    disk.used = TOTAL * 80 // 100
    server.apply_disk_usage(server.measure_disk_usage())
    assert not server.read_only


async def test_a_disk_past_the_warn_fraction_is_logged_once_before_read_only(
    disk_and_server: tuple[ReservedBlocksDisk, ShardServer],
) -> None:
    """`read_only.disk_warn_fraction` (0.90): the operator hears of a filling disk before the
    shard refuses adds (BookKeeper's diskUsageWarnThreshold); it was checked by nothing."""
    disk, server = disk_and_server
    almost_full = TOTAL - RESERVED - TOTAL * 8 // 100  # 91.6% as the bookie sees it.
    with structlog.testing.capture_logs() as logs:
        disk.used = almost_full
        server.apply_disk_usage(server.measure_disk_usage())
        server.apply_disk_usage(server.measure_disk_usage())  # Said once, not every check.
        assert not server.read_only
        disk.used = TOTAL // 2
        server.apply_disk_usage(server.measure_disk_usage())
        disk.used = almost_full  # Filling again: said again.
        server.apply_disk_usage(server.measure_disk_usage())
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["disk_almost_full", "disk_almost_full"]
    assert warnings[0]["usage_fraction"] == pytest.approx(870 / 950, abs=1e-4)
