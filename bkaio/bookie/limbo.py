"""Limbo: the ledgers a bookie may have lost entries of, persisted per shard.

A bookie that comes back with a new cookie instance under an id the metadata already knows
(its disks were wiped and reformatted) may have acknowledged entries it no longer holds. Before
it serves anything it puts into limbo every ledger whose ensembles (any segment) name it, from
the ledger metadata, and persists that set in each shard's first ledger directory (`LIMBO`,
JSON, written atomically) before the cookie copy in metadata is published. So a crash at any
point of the start keeps the ledgers in limbo: with no copy published, the next start detects
the reformat again.

While a ledger is in limbo on a shard (bkaio/bookie/server.py):
- a read of an entry the shard does not hold answers DATA_UNKNOWN, never NO_SUCH_ENTRY or
  NO_SUCH_LEDGER, so no recovery counts it as evidence of absence;
- the ledger is fenced there: a plain add answers FENCED (the bookie cannot know whether a
  recovery fenced the ledger before the reformat); recovery adds are taken, since they are how
  the entries come back.
The bookie then copies its fragments back from the other replicas
(bkaio/autorecovery/limbo_repair.py) and clears each ledger from the set once complete.

This module owns the file and the in-memory set a shard checks; no network, no metadata.
Blocking file I/O: `read_limbo`, `write_limbo`, `enter_limbo` and `load_limbo` run in an
executor (or before the event loop serves anything).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge

from bkaio.config import BookieConfig
from bkaio.entrylog.cookie import fsync_directory
from bkaio.errors import BKError

log = structlog.get_logger(__name__)

LIMBO_FILE = "LIMBO"
_LAYOUT_VERSION = 1


class LimboFileError(BKError):
    """A LIMBO file exists but cannot be read (or written): the bookie refuses to start rather
    than forget which ledgers it may have lost."""


def _unreadable(where: str, problem: str) -> LimboFileError:
    """The one error for a LIMBO file that cannot be read: names it, why, and what to do."""
    return LimboFileError(
        f"{where}: unreadable limbo file ({problem}); it lists the ledgers this bookie may have "
        "lost entries of, so the bookie does not start without it: make it a file the bookie "
        "can read again (its permissions, its owner, not a directory), or, if its content is "
        "lost, wipe the bookie with `bkaio bookie format --force` so that it rejoins with every "
        "ledger naming it in limbo"
    )


@dataclass(frozen=True, slots=True)
class LimboRecord:
    """One shard's limbo set as stored."""

    ledgers: frozenset[int]
    entered_at: float  # time.time() when the bookie first entered limbo.
    reason: str

    def to_bytes(self) -> bytes:
        body = {
            "layout_version": _LAYOUT_VERSION,
            "entered_at": self.entered_at,
            "reason": self.reason,
            "ledgers": sorted(self.ledgers),
        }
        return json.dumps(body).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> LimboRecord:
        try:
            body: Any = json.loads(data)
            if body["layout_version"] != _LAYOUT_VERSION:
                raise ValueError(f"layout version {body['layout_version']}")
            ledgers = frozenset(int(ledger_id) for ledger_id in body["ledgers"])
            return cls(ledgers, float(body["entered_at"]), str(body["reason"]))
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            raise _unreadable(where, repr(error)) from error


def limbo_path(config: BookieConfig, shard_index: int) -> Path:
    return config.storage[shard_index].ledger_dirs[0] / LIMBO_FILE


def read_limbo(path: Path) -> LimboRecord | None:
    """The record at `path`; None when there is none (nothing in limbo). Any other failure to
    read it (permission denied, a directory in its place) is a `LimboFileError`."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise _unreadable(str(path), error.strerror or repr(error)) from error
    return LimboRecord.from_bytes(data, str(path))


def write_limbo(path: Path, record: LimboRecord | None) -> None:
    """Atomically (temp file, fsync, rename, fsync the directory); None removes the file."""
    if record is None or not record.ledgers:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_directory(path.parent)
        return
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(record.to_bytes())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def enter_limbo(config: BookieConfig, ledger_ids: Iterable[int], reason: str) -> dict[int, int]:
    """Put `ledger_ids` into limbo, each on its shard (L % shards), merged with what is there
    already; durable when it returns. Ledgers in limbo per shard."""
    by_shard: dict[int, set[int]] = {index: set() for index in range(config.shard_count)}
    for ledger_id in ledger_ids:
        by_shard[ledger_id % config.shard_count].add(ledger_id)
    now = time.time()
    counts: dict[int, int] = {}
    for shard_index, ledgers in by_shard.items():
        path = limbo_path(config, shard_index)
        old = read_limbo(path)
        merged = ledgers | (old.ledgers if old else frozenset())
        counts[shard_index] = len(merged)
        if not merged:
            continue
        entered_at = old.entered_at if old else now
        record = LimboRecord(frozenset(merged), entered_at, old.reason if old else reason)
        try:
            write_limbo(path, record)
        except OSError as error:
            raise LimboFileError(
                f"{path}: cannot write the limbo file ({error}); the bookie does not start "
                "without it: make its directory writable by the bookie"
            ) from error
    return counts


def load_limbo(config: BookieConfig) -> dict[int, LimboRecord]:
    """Every shard's record (shards with nothing in limbo are absent)."""
    records = {}
    for shard_index in range(config.shard_count):
        record = read_limbo(limbo_path(config, shard_index))
        if record is not None and record.ledgers:
            records[shard_index] = record
    return records


@dataclass
class LimboLedgers:
    """One shard's limbo set: `ids` is what the shard server checks (an empty set costs one
    truth test per request); `clear` persists before it returns."""

    path: Path
    ids: set[int] = field(default_factory=set)
    entered_at: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        self._lock = asyncio.Lock()

    @classmethod
    def load(cls, path: Path) -> LimboLedgers:
        """Blocking: call before the shard serves."""
        record = read_limbo(path)
        if record is None:
            return cls(path)
        return cls(path, set(record.ledgers), record.entered_at, record.reason)

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self.ids

    async def clear(self, ledger_id: int) -> bool:
        """Take the ledger out of limbo (it was copied back); False if it was not in it.
        The file is rewritten first: a crash before that leaves the ledger in limbo."""
        async with self._lock:
            if ledger_id not in self.ids:
                return False
            remaining = frozenset(self.ids - {ledger_id})
            record = LimboRecord(remaining, self.entered_at, self.reason) if remaining else None
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, write_limbo, self.path, record
                )
            except OSError as error:
                raise LimboFileError(f"{self.path}: cannot persist limbo: {error}") from error
            self.ids.discard(ledger_id)
        log.info("ledger_left_limbo", ledger_id=ledger_id, remaining=len(self.ids))
        return True

    def summary(self) -> dict[str, Any]:
        return {
            "ledgers": len(self.ids),
            "entered_at": self.entered_at if self.ids else None,
            "reason": self.reason if self.ids else None,
        }


class LimboMetrics:
    """The bookie parent's view of its limbo (all shards), in its metrics registry; also the
    `LimboProgress` the repair reports to."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ledgers: set[int] = set()
        self.entered_at = 0.0
        self.last_error: str | None = None
        self.entries_copied = 0
        self.bytes_copied = 0
        self.repaired_count = 0
        self.failures = 0
        ledgers = Gauge(
            "bkaio_bookie_limbo_ledgers",
            "Ledgers in limbo on this bookie (it may have lost entries of them)",
            registry=registry,
        )
        ledgers.set_function(lambda: float(len(self.ledgers)))
        seconds = Gauge(
            "bkaio_bookie_limbo_seconds",
            "Seconds since this bookie entered limbo (0 when no ledger is in limbo)",
            registry=registry,
        )
        seconds.set_function(self.seconds_in_limbo)
        self._entries = Counter(
            "bkaio_bookie_limbo_entries_copied",
            "Entries copied back to this bookie from other replicas to leave limbo",
            registry=registry,
        )
        self._repaired = Counter(
            "bkaio_bookie_limbo_ledgers_repaired",
            "Ledgers copied back and taken out of limbo",
            registry=registry,
        )
        self._failed = Counter(
            "bkaio_bookie_limbo_repair_failures",
            "Attempts to copy a ledger in limbo back that failed and will be retried",
            registry=registry,
        )

    def load(self, records: dict[int, LimboRecord]) -> None:
        self.ledgers = {ledger_id for record in records.values() for ledger_id in record.ledgers}
        self.entered_at = min((r.entered_at for r in records.values()), default=0.0)

    def seconds_in_limbo(self) -> float:
        return max(0.0, time.time() - self.entered_at) if self.ledgers else 0.0

    def copied(self, entries: int, payload_bytes: int) -> None:
        self.entries_copied += entries
        self.bytes_copied += payload_bytes
        self._entries.inc(entries)

    def repaired(self, ledger_id: int) -> None:
        self.ledgers.discard(ledger_id)
        self.repaired_count += 1
        self._repaired.inc()

    def failed(self, ledger_id: int, error: BKError) -> None:
        self.failures += 1
        self.last_error = f"ledger {ledger_id}: {type(error).__name__}: {error}"
        self._failed.inc()

    def summary(self) -> dict[str, Any]:
        return {
            "ledgers": len(self.ledgers),
            "entered_at": self.entered_at if self.ledgers else None,
            "seconds": round(self.seconds_in_limbo(), 1),
            "ledgers_repaired": self.repaired_count,
            "entries_copied": self.entries_copied,
            "bytes_copied": self.bytes_copied,
            "repair_failures": self.failures,
            "last_error": self.last_error,
        }
