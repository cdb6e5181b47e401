"""Storage faults turn a shard's storage read-only until a flush works again (in process).

Each fault is one a real disk gives: ENOSPC writing the entry logs, EIO syncing the checkpoint,
EROFS committing the index. The flush loop runs under the loop's supervisor: the failure is
logged at ERROR with the task's name and counted, `write_failure` says why, the listener (the
shard server, which then refuses adds with READ_ONLY) hears True, acknowledged entries stay
readable, the journal's checkpoint mark does not move, and the first flush that works after the
fault clears makes it writable again. In a real bookie: tests/faults/test_storage_faults.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from prometheus_client import REGISTRY

from bkaio.entrylog.checkpoint import read_last_mark
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.index import LedgerIndex
from bkaio.entrylog.shard_storage import ShardStorage, StoredEntry
from bkaio.errors import BookieIOError
from bkaio.journal.records import JournalMark
from bkaio.testing.disk import FakeDisk
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_config, make_entry

LEDGERS = (3, 4)


async def _add(storage: ShardStorage, entry_ids: range) -> list[StoredEntry]:
    entries = [make_entry(ledger_id, e) for ledger_id in LEDGERS for e in entry_ids]
    await asyncio.gather(*(add_entry(storage, entry, KEY) for entry in entries))
    return entries


def _marks(config: StorageConfig) -> list[JournalMark | None]:
    return read_last_mark([Path(d) for d in config.ledger_dirs], len(config.journal.directories))


async def _wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(3000):  # ~30 s: a bound for a hung test, not a timing claim.
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def _failures() -> float:
    value = REGISTRY.get_sample_value("bkaio_task_failures_total", {"task": "storage_flush"})
    return 0.0 if value is None else value


class _Fault:
    """Turns a fault on and off: the FakeDisk's fault file, or the index's commit."""

    def __init__(self, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind = kind
        self.fault_file = tmp_path / "disk_fault"
        self.disk = FakeDisk(fault_file=self.fault_file)
        self._monkeypatch = monkeypatch
        self._index_broken = False
        commit = LedgerIndex.commit_entries

        def commit_entries(index: LedgerIndex, *args: object, **kwargs: object) -> None:
            if self._index_broken:  # What LMDB reports when the file system went read-only.
                raise BookieIOError(f"{index.directory}: index commit failed: [Errno 30] EROFS")
            commit(index, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(LedgerIndex, "commit_entries", commit_entries)

    def start(self) -> None:
        if self.kind == "index_erofs":
            self._index_broken = True
        elif self.kind == "entry_log_enospc":
            self.fault_file.write_text("ENOSPC .log\n")
        else:
            self.fault_file.write_text("EIO lastMark.tmp sync\n")

    def clear(self) -> None:
        self._index_broken = False
        self.fault_file.unlink(missing_ok=True)

    @property
    def expected(self) -> str:
        return {"entry_log_enospc": "ENOSPC", "checkpoint_eio": "EIO", "index_erofs": "EROFS"}[
            self.kind
        ]


@pytest.fixture(params=["entry_log_enospc", "checkpoint_eio", "index_erofs"])
def fault(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[_Fault]:
    injected = _Fault(str(request.param), tmp_path, monkeypatch)
    yield injected
    injected.clear()


async def test_a_storage_fault_makes_the_shard_read_only_until_a_flush_works(
    open_storage: OpenStorage, tmp_path: Path, fault: _Fault
) -> None:
    config = make_config(tmp_path, flush_interval_seconds=0.05)
    storage = await open_storage(config, entry_log_disk=fault.disk)
    heard: list[bool] = []
    storage.write_failure_listener = heard.append
    mark_before = _marks(config)
    failures_before = _failures()
    fault.start()
    with structlog.testing.capture_logs() as logs:
        entries = await _add(storage, range(20))  # The journal is healthy: acknowledged.
        await _wait_until(lambda: heard == [True])
    assert storage.write_failure is not None and fault.expected in storage.write_failure
    failed = [e for e in logs if e["event"] == "task_failed"]
    assert failed and failed[0]["task"].startswith("storage_flush[")
    assert failed[0]["log_level"] == "error" and failed[0]["exc_info"] is not None
    assert _failures() > failures_before
    assert _marks(config) == mark_before  # The journal is not released past the flush.
    for entry in entries:  # Acknowledged entries stay readable (from the write cache).
        assert await read_entry(storage, entry.ledger_id, entry.entry_id) == entry

    fault.clear()
    await _wait_until(lambda: heard == [True, False])  # The next flush works: writable.
    assert storage.write_failure is None
    assert _marks(config) != mark_before
    await storage.close(checkpoint=False)
    reopened = await open_storage(config)
    for entry in entries:
        assert await read_entry(reopened, entry.ledger_id, entry.entry_id) == entry


async def test_a_fault_file_fails_only_what_it_names(tmp_path: Path) -> None:
    fault_file = tmp_path / "fault"
    disk = FakeDisk(fault_file=fault_file)
    target = os.open(tmp_path / "a.log", os.O_RDWR | os.O_CREAT)
    other = os.open(tmp_path / "a.jnl", os.O_RDWR | os.O_CREAT)
    try:
        fault_file.write_text("ENOSPC .log write\n")
        with pytest.raises(OSError) as caught:
            disk.write(target, b"x", 0)
        assert caught.value.errno == errno.ENOSPC
        disk.fdatasync(target)  # Only writes were named.
        disk.write(other, b"x", 0)  # Another file.
        fault_file.unlink()
        disk.write(target, b"x", 0)  # Healed.
    finally:
        disk.close(target)
        disk.close(other)
