"""The journal's branch of the bookie configuration: one typed, frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bkaio.errors import ConfigError

# A journal file must hold its header and at least a few records; smaller is a typo.
MIN_FILE_BYTES = 4096
# Adaptive wait beyond 10 ms would be a fixed delay, not a coalescing window.
MAX_ADAPTIVE_WAIT_US = 10_000
# A lazy record waits at most this long for company; longer would be a durability setting.
MAX_LAZY_RECORD_DELAY_MS = 10_000
# Zero-filling ahead writes and syncs this much at a time (`bkaio.journal.zero_fill`).
ZERO_FILL_CHUNK_BYTES = 256 * 1024


# A group absorbs this much while the previous one syncs (about 100 ms of a loaded bookie), or
# a journal file's worth when files are smaller (tests): the default is lowered to fit them.
DEFAULT_MAX_GROUP_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalConfig:
    """How the journals of one bookie shard write.

    `directories`: one journal (one writer thread, its own files) per directory; ideally each
    on its own disk. Ledger storage routes a ledger's records to one of them
    (`StorageConfig.journal_of`).
    `max_group_bytes` / `max_group_entries`: bounds of one group commit. They bound memory (at
    most two groups exist: one being written, one filling) and the size of one write.
    `max_file_bytes`: a journal file is rolled, after a sync, once it reaches this size.
    `adaptive_wait_us`: 0 commits as soon as the writer is free, with no timer. A positive
    value lets a group of two records or more (a burst) that finds the writer free wait for the
    next append, at most this long: at moderate rates the next burst shares its write, sync and
    answers. A single record never waits, and a wait that catches nothing turns waiting off
    for a while (bkaio.journal.journal).
    `lazy_record_delay_ms`: how long a record appended as lazy (an explicit LAC from WRITE_LAC)
    may wait in the filling group for a group that other records cause, before it goes alone.
    Such a record's loss in a crash only lowers the bookie's LAC; 0 commits it like any other.
    `sync`: False skips fdatasync. UNSAFE: an acknowledged record can be lost on power failure
    or kill -9 of the host. For tests only.
    `preallocate_next_file`: zero-fill and sync the *next* file in a background thread, so that
    commits overwrite allocated blocks.
    `preallocate_ahead_bytes`: keep the *current* file zero-filled and synced this far past the
    last commit, from a background thread (`bkaio.journal.zero_fill`), so that commits change no
    file size and their fdatasync commits no filesystem metadata. 0 turns it off; it is off
    anyway with `sync` off or a fault-injection disk.
    """

    directories: tuple[Path, ...]
    max_group_bytes: int = DEFAULT_MAX_GROUP_BYTES
    max_group_entries: int = 10_000
    max_file_bytes: int = 256 * 1024 * 1024
    adaptive_wait_us: int = 0
    lazy_record_delay_ms: int = 200
    sync: bool = True
    preallocate_next_file: bool = False
    preallocate_ahead_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        if not isinstance(self.directories, tuple) or not self.directories:
            raise ConfigError(
                f"journal.directories={self.directories!r} must be a non-empty tuple of paths"
            )
        resolved = [Path(directory).absolute() for directory in self.directories]
        if len(set(resolved)) != len(resolved):
            raise ConfigError(f"journal.directories={self.directories!r} names a directory twice")
        if self.max_file_bytes < MIN_FILE_BYTES:
            raise ConfigError(
                f"journal.max_file_bytes={self.max_file_bytes} must be at least {MIN_FILE_BYTES}"
            )
        if self.max_group_bytes == DEFAULT_MAX_GROUP_BYTES > self.max_file_bytes > 0:
            object.__setattr__(self, "max_group_bytes", self.max_file_bytes)
        if not 0 < self.max_group_bytes <= self.max_file_bytes:
            raise ConfigError(
                f"journal.max_group_bytes={self.max_group_bytes} must be in "
                f"(0, journal.max_file_bytes={self.max_file_bytes}]"
            )
        if (
            self.preallocate_ahead_bytes != 0
            and self.preallocate_ahead_bytes < ZERO_FILL_CHUNK_BYTES
        ):
            raise ConfigError(
                f"journal.preallocate_ahead_bytes={self.preallocate_ahead_bytes} must be 0 (off) "
                f"or at least {ZERO_FILL_CHUNK_BYTES}"
            )
        if self.max_group_entries <= 0:
            raise ConfigError(
                f"journal.max_group_entries={self.max_group_entries} must be positive"
            )
        if not 0 <= self.lazy_record_delay_ms <= MAX_LAZY_RECORD_DELAY_MS:
            raise ConfigError(
                f"journal.lazy_record_delay_ms={self.lazy_record_delay_ms} must be in "
                f"[0, {MAX_LAZY_RECORD_DELAY_MS}] (0 = commit at once)"
            )
        if not 0 <= self.adaptive_wait_us <= MAX_ADAPTIVE_WAIT_US:
            raise ConfigError(
                f"journal.adaptive_wait_us={self.adaptive_wait_us} must be in "
                f"[0, {MAX_ADAPTIVE_WAIT_US}] (0 = off)"
            )
