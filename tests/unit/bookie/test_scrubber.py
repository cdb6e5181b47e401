"""The background scrubber over real storage: it verifies every entry a batch at a time, pausing
to keep the configured rate, and reports what it found in its status and metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import crc32c
from prometheus_client import CollectorRegistry

from bkaio.bookie.scrubber import Scrubber, ScrubMetrics
from bkaio.config import ScrubConfig
from bkaio.entrylog.log_reader import iter_log_records, log_path
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from bkaio.journal import open_journal
from tests.fixtures.storage import add_entry
from tests.unit.entrylog.conftest import KEY, make_config, make_entry


def crc_ok(entry: StoredEntry) -> bool:
    return crc32c.crc32c(entry.payload) == entry.digest


def damage_entry(path: Path, entry_id: int) -> None:
    """Flip the last payload byte of one entry's record in an entry log."""
    damaged = next(r for r in iter_log_records(path) if r.entry and r.entry.entry_id == entry_id)
    with open(path, "r+b") as file:
        file.seek(damaged.offset + damaged.size - 1)
        byte = file.read(1)
        file.seek(damaged.offset + damaged.size - 1)
        file.write(bytes([byte[0] ^ 0xFF]))


async def test_scrub_at_a_bounded_rate_and_report(tmp_path: Path) -> None:
    storage = await ShardStorage.open(
        make_config(tmp_path, disks=1),
        bookie_id="b:1",
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
    )
    try:
        await _scrub_and_report(storage, tmp_path)
    finally:
        await storage.close()


async def _scrub_and_report(storage: ShardStorage, tmp_path: Path) -> None:
    await asyncio.gather(*(add_entry(storage, make_entry(7, e), KEY) for e in range(250)))
    await storage.checkpoint()
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)

    registry = CollectorRegistry()
    config = ScrubConfig(period_seconds=3600, rate_entries_per_second=100)
    scrubber = Scrubber(storage, config, ScrubMetrics(registry), digest_ok=crc_ok, sleep=sleep)
    report = await scrubber.run_once()
    assert report.ok and report.entries == 250
    # Batches of `rate` entries, a pause after each but the last: 100 entries a second.
    assert len(pauses) == 2 and all(0 < pause <= 1.0 for pause in pauses)
    status = scrubber.to_dict()
    assert status["runs"] == 1 and status["last_entries"] == 250 and status["last_problems"] == 0
    assert registry.get_sample_value("bkaio_bookie_scrub_entries_checked_total") == 250

    await asyncio.to_thread(damage_entry, log_path(tmp_path / "ledgers0" / "logs", 0), 42)
    report = await scrubber.run_once()
    assert report.problem_count == 1
    status = scrubber.to_dict()
    assert status["last_problems"] == 1 and status["last_ledgers_with_problems"] == [7]
    assert status["last_problem_samples"][0]["entry_id"] == 42
    assert registry.get_sample_value("bkaio_bookie_scrub_problems_total") == 1
    assert registry.get_sample_value("bkaio_bookie_scrub_last_run_problems") == 1
    assert registry.get_sample_value("bkaio_bookie_scrub_runs_total") == 2
