"""Configuration of one shard's ledger storage: disks, write cache, compaction, disk limits.

Imports only `bkaio.errors` and the journal's config; validation raises `ConfigError` with the
field name, the value and the rule it breaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bkaio.errors import ConfigError
from bkaio.wal.config import JournalConfig

# Entry locations keep a 32-bit byte offset, so an entry log must stay below 4 GiB.
MAX_ENTRY_LOG_BYTES = (1 << 32) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageConfig:
    journal: JournalConfig
    ledger_dirs: tuple[Path, ...]  # One entry-log directory per disk.
    index_dirs: tuple[Path, ...]  # One index directory per disk, paired with ledger_dirs.
    write_cache_bytes: int = 64 * 1024 * 1024
    write_cache_max_wait_seconds: float = 10.0  # Adders wait this long for a flush, then 429.
    flush_interval_seconds: float = 1.0
    # A flush writes and fsyncs the entry logs this many bytes at a time (0: all at once). A
    # journal on the same device waits for whatever is in the device's queue at its fdatasync;
    # small chunks keep that short instead of one burst of the whole write cache.
    flush_sync_bytes: int = 256 * 1024
    entry_log_max_bytes: int = 256 * 1024 * 1024
    compaction_threshold: float = 0.5  # Entry logs with a live fraction below this are rewritten.
    disk_warn_fraction: float = 0.90
    disk_read_only_fraction: float = 0.95
    index_map_bytes: int = 1 << 36  # LMDB address space per index; sparse, not preallocated.
    # The bookie's shard count. A shard only sees ledgers with L % shards == its index, so
    # spreading by L % disks would put all of them on one disk whenever disks divides shards:
    # spread by (L // ledger_stride) instead.
    ledger_stride: int = 1

    def __post_init__(self) -> None:
        if not self.ledger_dirs:
            raise ConfigError("storage.ledger_dirs is empty: at least one disk is needed")
        if len(self.ledger_dirs) != len(self.index_dirs):
            raise ConfigError(
                f"storage.index_dirs has {len(self.index_dirs)} directories but "
                f"storage.ledger_dirs has {len(self.ledger_dirs)}: one index dir per ledger dir"
            )
        all_dirs = [Path(d).resolve() for d in (*self.ledger_dirs, *self.index_dirs)]
        if len(set(all_dirs)) != len(all_dirs):
            raise ConfigError(
                f"storage directories must be distinct: ledger_dirs={self.ledger_dirs} "
                f"index_dirs={self.index_dirs}"
            )
        # Written `not x > 0` rather than `x <= 0` so that NaN fails them too.
        if not self.write_cache_bytes > 0:
            raise ConfigError(f"storage.write_cache_bytes={self.write_cache_bytes} must be > 0")
        if not self.write_cache_max_wait_seconds >= 0:
            raise ConfigError(
                f"storage.write_cache_max_wait_seconds={self.write_cache_max_wait_seconds} "
                "must be >= 0"
            )
        if not self.flush_interval_seconds > 0:
            raise ConfigError(
                f"storage.flush_interval_seconds={self.flush_interval_seconds} must be > 0"
            )
        if not self.flush_sync_bytes >= 0:
            raise ConfigError(
                f"storage.flush_sync_bytes={self.flush_sync_bytes} must be >= 0 (0 = one sync)"
            )
        if not 1024 <= self.entry_log_max_bytes <= MAX_ENTRY_LOG_BYTES:
            raise ConfigError(
                f"storage.entry_log_max_bytes={self.entry_log_max_bytes} must be in "
                f"[1024, {MAX_ENTRY_LOG_BYTES}] (locations hold a 32-bit offset)"
            )
        if not 0.0 <= self.compaction_threshold <= 1.0:
            raise ConfigError(
                f"storage.compaction_threshold={self.compaction_threshold} must be in [0, 1]"
            )
        if not 0.0 < self.disk_warn_fraction <= self.disk_read_only_fraction <= 1.0:
            raise ConfigError(
                f"storage.disk_warn_fraction={self.disk_warn_fraction} and "
                f"disk_read_only_fraction={self.disk_read_only_fraction} must satisfy "
                "0 < warn <= read_only <= 1"
            )
        if self.ledger_stride < 1:
            raise ConfigError(f"storage.ledger_stride={self.ledger_stride} must be >= 1")
        if self.index_map_bytes < 1 << 20:
            raise ConfigError(f"storage.index_map_bytes={self.index_map_bytes} must be >= 1 MiB")

    @property
    def disk_count(self) -> int:
        return len(self.ledger_dirs)

    def disk_of(self, ledger_id: int) -> int:
        """The disk (index into ledger_dirs/index_dirs) that stores `ledger_id`."""
        return (ledger_id // self.ledger_stride) % len(self.ledger_dirs)

    def journal_of(self, ledger_id: int) -> int:
        """The journal (index into journal.directories) that logs `ledger_id`."""
        return (ledger_id // self.ledger_stride) % len(self.journal.directories)
