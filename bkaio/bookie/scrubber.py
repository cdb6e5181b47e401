"""The shard's background scrubber: the local consistency check, run periodically and slowly.

BookKeeper's `localScrubPeriod` / `localScrubRateLimit` as `[scrub] period_seconds` (0: off,
the default) and `rate_entries_per_second`. Every period the scrubber walks every disk's index
in key order, a batch at a time on a worker thread, reading each entry back through the live
storage's readers and verifying it (bkaio/entrylog/consistency.py: record checksum, index
location, the writer's digest); between batches it sleeps so that it reads at most the
configured rate. What it finds is logged (one ERROR per damaged entry, bounded), counted
(`bkaio_bookie_scrub_*`) and kept for `GET /api/v1/bookie/info` (`status()`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from bkaio.config import ScrubConfig
from bkaio.entrylog.consistency import (
    BatchResult,
    ConsistencyReport,
    DigestCheck,
    EntryReader,
    check_batch,
)
from bkaio.entrylog.index import LedgerIndex
from bkaio.errors import BKError

log = structlog.get_logger(__name__)

MAX_BATCH_ENTRIES = 500  # Entries verified per thread hop (and per read transaction).
MAX_LOGGED_PROBLEMS = 100  # ERROR lines per run; the rest are counted.
MAX_LEDGERS_REPORTED = 100  # Ledgers with problems listed in status().


class ScrubbedStorage(Protocol):
    """What the scrubber reads (`ShardStorage.disk_readers`)."""

    def disk_readers(self) -> Sequence[tuple[LedgerIndex, EntryReader]]: ...


class ScrubMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "bkaio_bookie_scrub_runs", "Completed scrubs of every stored entry", registry=registry
        )
        self.entries = Counter(
            "bkaio_bookie_scrub_entries_checked",
            "Entries read back and verified by the scrubber",
            registry=registry,
        )
        self.problems = Counter(
            "bkaio_bookie_scrub_problems",
            "Damaged or misplaced entries the scrubber found",
            registry=registry,
        )
        self.last_problems = Gauge(
            "bkaio_bookie_scrub_last_run_problems",
            "Problems found by the last completed scrub (0: every entry verified)",
            registry=registry,
        )
        self.last_run = Gauge(
            "bkaio_bookie_scrub_last_run_timestamp_seconds",
            "When the last completed scrub finished (Unix time; 0: never)",
            registry=registry,
        )


@dataclass(slots=True)
class ScrubStatus:
    running: bool = False
    runs: int = 0
    current_entries: int = 0  # Entries verified so far by the run in progress.
    last_started: float | None = None  # Unix time.
    last_finished: float | None = None
    last_entries: int = 0
    last_problems: int = 0
    last_ledgers_with_problems: list[int] = field(default_factory=list)
    last_problem_samples: list[dict[str, object]] = field(default_factory=list)


class Scrubber:
    def __init__(
        self,
        storage: ScrubbedStorage,
        config: ScrubConfig,
        metrics: ScrubMetrics,
        *,
        digest_ok: DigestCheck,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        assert config.period_seconds > 0, "a scrubber with period 0 is never started"
        self._storage = storage
        self._config = config
        self._metrics = metrics
        self._digest_ok = digest_ok
        self._clock = clock
        self._sleep = sleep  # Tests count the pauses that bound the rate.
        self.status = ScrubStatus()

    async def run_forever(self) -> None:
        """One scrub every `period_seconds` (measured start to start), the first one a period
        after start-up (a restarting bookie has replay and catch-up to do first)."""
        loop = asyncio.get_running_loop()
        period = self._config.period_seconds
        next_start = loop.time() + period
        while True:
            await asyncio.sleep(max(0.0, next_start - loop.time()))
            started = loop.time()
            try:
                await self.run_once()
            except (BKError, OSError) as error:  # A disk error: say so, try again next period.
                log.error("scrub_failed", error=str(error))
            took = loop.time() - started
            if took > period:  # The next one starts at once; raise the rate or the period.
                log.warning("scrub_longer_than_period", seconds=round(took, 1), period=period)
            next_start = started + period

    async def run_once(self) -> ConsistencyReport:
        """Verify every stored entry once, at most `rate_entries_per_second`."""
        loop = asyncio.get_running_loop()
        status = self.status
        status.running, status.current_entries = True, 0
        status.last_started = self._clock()
        report = ConsistencyReport()
        batch_entries = max(1, min(MAX_BATCH_ENTRIES, int(self._config.rate_entries_per_second)))
        try:
            for index, reader in self._storage.disk_readers():
                after: tuple[int, int] | None = None
                while True:
                    began = loop.time()
                    batch: BatchResult = await loop.run_in_executor(
                        None, self._batch, index, reader, after, batch_entries
                    )
                    self._record(batch, report)
                    if batch.done:
                        break
                    after = batch.last_key
                    budget = batch.checked / self._config.rate_entries_per_second
                    await self._sleep(max(0.0, budget - (loop.time() - began)))
        finally:
            status.running = False
        status.runs += 1
        status.last_finished = self._clock()
        status.last_entries = report.entries
        status.last_problems = report.problem_count
        status.last_ledgers_with_problems = sorted(
            ledger.ledger_id for ledger in report.ledgers.values() if ledger.problems
        )[:MAX_LEDGERS_REPORTED]
        status.last_problem_samples = [p.to_dict() for p in report.problems[:10]]
        self._metrics.runs.inc()
        self._metrics.last_problems.set(report.problem_count)
        self._metrics.last_run.set(status.last_finished)
        log.info(
            "scrub_finished",
            entries=report.entries,
            problems=report.problem_count,
            ledgers_with_problems=status.last_ledgers_with_problems[:10],
        )
        return report

    def _batch(
        self,
        index: LedgerIndex,
        reader: EntryReader,
        after: tuple[int, int] | None,
        limit: int,
    ) -> BatchResult:
        return check_batch(index, reader, after=after, limit=limit, digest_ok=self._digest_ok)

    def _record(self, batch: BatchResult, report: ConsistencyReport) -> None:
        logged = report.problem_count
        report.add(batch)
        self.status.current_entries = report.entries
        self._metrics.entries.inc(batch.checked)
        self._metrics.problems.inc(len(batch.problems))
        for problem in batch.problems:
            if logged < MAX_LOGGED_PROBLEMS:
                log.error("scrub_found_damaged_entry", **problem.to_dict())
            logged += 1

    def to_dict(self) -> dict[str, Any]:
        status = self.status
        return {
            "enabled": True,
            "period_seconds": self._config.period_seconds,
            "rate_entries_per_second": self._config.rate_entries_per_second,
            "running": status.running,
            "runs": status.runs,
            "current_entries": status.current_entries,
            "last_started": status.last_started,
            "last_finished": status.last_finished,
            "last_entries": status.last_entries,
            "last_problems": status.last_problems,
            "last_ledgers_with_problems": list(status.last_ledgers_with_problems),
            "last_problem_samples": list(status.last_problem_samples),
        }
