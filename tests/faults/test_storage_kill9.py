"""kill -9 a process appending to ShardStorage at random moments; nothing acknowledged is lost.

Each round starts `storage_child.py` on the same directories, lets it append (and flush,
checkpoint, delete, compact) for a random short while, kills it with SIGKILL, then reopens the
storage here and checks: every acknowledged entry reads back byte for byte, nothing readable
differs from what the child derived for that id or lies beyond what it tried to add, and
acknowledged deletions stay deleted. Seeded by BKAIO_SEED (printed; replay a failure with it).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.journal import open_journal
from tests.faults.storage_child import (
    BOOKIE_ID,
    TASKS,
    expected_entry,
    storage_config,
)
from tests.fixtures.storage import read_entry

ROUNDS = 20
CHILD = Path(__file__).with_name("storage_child.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class History:
    acked: dict[int, set[int]] = field(default_factory=dict)
    tried: dict[int, int] = field(default_factory=dict)  # ledger -> highest entry id tried.
    deleted: set[int] = field(default_factory=set)
    maybe_deleted: set[int] = field(default_factory=set)

    def read_output(self, output: str) -> None:
        for line in output.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] in ("ADD", "ACK") and words[2].isdigit():
                ledger_id, entry_id = int(words[1]), int(words[2])
                if words[0] == "ACK":
                    self.acked.setdefault(ledger_id, set()).add(entry_id)
                self.tried[ledger_id] = max(self.tried.get(ledger_id, -1), entry_id)
            elif len(words) == 2 and words[0] == "DELETE" and words[1].isdigit():
                self.maybe_deleted.add(int(words[1]))
            elif len(words) == 2 and words[0] == "DELETED" and words[1].isdigit():
                self.deleted.add(int(words[1]))


async def _run_child(root: Path, seed: int, round_number: int, run_seconds: float) -> str:
    """Start the child, wait for READY, let it run, SIGKILL it; return its stdout."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(root),
        str(seed),
        str(round_number),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        async with asyncio.timeout(30):
            first = await process.stdout.readline()
        assert first == b"READY\n", (first, await process.stderr.read())
        await asyncio.sleep(run_seconds)
        assert process.returncode is None, await process.stderr.read()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        output, errors = await process.communicate()
    assert process.returncode == -signal.SIGKILL, errors.decode(errors="replace")[-2000:]
    return output.decode(errors="replace")


async def _check(storage: ShardStorage, seed: int, history: History, ledgers: list[int]) -> int:
    checked = 0
    stored = set(storage.ledger_ids())
    assert not stored & history.deleted, f"deleted ledgers came back: {stored & history.deleted}"
    for ledger_id in ledgers:
        if ledger_id in history.maybe_deleted and ledger_id not in stored:
            continue  # Killed during its deletion, which completed.
        acked = history.acked.get(ledger_id, set())
        if ledger_id not in stored:
            assert not acked, f"ledger {ledger_id} with acknowledged entries is gone"
            continue
        for entry_id in sorted(acked):
            entry = await read_entry(storage, ledger_id, entry_id)
            assert entry == expected_entry(seed, ledger_id, entry_id), (ledger_id, entry_id)
            checked += 1
        for first, last in await storage.list_entries(ledger_id):
            assert last <= history.tried.get(ledger_id, -1), (ledger_id, last, "never added")
            for entry in await storage.read_range(ledger_id, first, last - first + 1, 1 << 30):
                assert entry == expected_entry(seed, ledger_id, entry.entry_id), entry.entry_id
    return checked


@pytest.mark.slow
async def test_acknowledged_entries_survive_kill_9(tmp_path: Path) -> None:
    seed = int(os.environ.get("BKAIO_SEED", random.randrange(1 << 32)))
    print(f"BKAIO_SEED={seed}")
    rng = random.Random(seed)
    history = History()
    total_checked = 0
    try:
        for round_number in range(ROUNDS):
            output = await _run_child(tmp_path, seed, round_number, rng.uniform(0.05, 0.6))
            history.read_output(output)
            storage = await ShardStorage.open(
                storage_config(tmp_path),
                bookie_id=BOOKIE_ID,
                shard_index=0,
                shard_count=1,
                journal_factory=open_journal,
            )
            try:
                ledgers = [round_number * 100 + task for task in range(TASKS)]
                if round_number > 0:
                    ledgers.append((round_number - 1) * 100)
                total_checked += await _check(storage, seed, history, ledgers)
            finally:
                await storage.close()
        storage = await ShardStorage.open(
            storage_config(tmp_path),
            bookie_id=BOOKIE_ID,
            shard_index=0,
            shard_count=1,
            journal_factory=open_journal,
        )
        try:
            await _check(storage, seed, history, sorted(history.tried))
        finally:
            await storage.close()
    except AssertionError as error:
        raise AssertionError(f"BKAIO_SEED={seed}: {error}") from error
    assert total_checked > 0
    print(f"checked {total_checked} acknowledged entries over {ROUNDS} kills")
