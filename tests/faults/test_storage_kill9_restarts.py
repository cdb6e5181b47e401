"""kill -9 a ShardStorage on two journals while it works, then again in the middle of its
start (after the first journal's replay, which flushed and checkpointed as it went, before the
second's); then nothing acknowledged is lost, deleted ledgers stay deleted, fences hold.

test_storage_kill9.py kills a process appending to one journal and restarts from a clean
close; here every round's second start replays a long journal tail through a small write
cache and is killed halfway, so its checkpoints are what the next start begins from. Each
round runs tests/faults/storage_restart_child.py twice: `work` (killed at a random moment),
`stall` (killed at the second journal's replay); then the test opens the storage itself and
checks everything the children printed. Seeded by BKAIO_SEED (printed).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.journal import open_journal
from tests.faults.storage_child import BOOKIE_ID, TASKS
from tests.faults.storage_restart_child import FENCED, LAC, VICTIM, restart_config
from tests.faults.test_storage_kill9 import History, _check

ROUNDS = 6
CHILD = Path(__file__).with_name("storage_restart_child.py")
REPO = Path(__file__).resolve().parents[2]
WORK_CACHE_BYTES = 1024 * 1024
# A quarter of what the work phase leaves unflushed at most: the replay flushes several times.
STALL_CACHE_BYTES = 128 * 1024


async def _run_child(
    root: Path, seed: int, round_number: int, phase: str, cache_bytes: int, kill_at: bytes
) -> tuple[str, str]:
    """Start the child; once it prints `kill_at`, wait a random moment (a `work` child) and
    SIGKILL it. Returns its stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        str(root),
        str(seed),
        str(round_number),
        phase,
        str(cache_bytes),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(60):  # A bound for a hung child, not a timing claim.
            first = await process.stdout.readline()
        assert first == kill_at, (first, phase)
        if phase == "work":
            await asyncio.sleep(random.Random(f"{seed}:{round_number}").uniform(0.05, 0.6))
        assert process.returncode is None
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        output, errors = await process.communicate()
    assert process.returncode == -signal.SIGKILL, errors.decode(errors="replace")[-2000:]
    return first.decode() + output.decode(errors="replace"), errors.decode(errors="replace")


async def _open(root: Path) -> ShardStorage:
    return await ShardStorage.open(
        restart_config(root, WORK_CACHE_BYTES),
        bookie_id=BOOKIE_ID,
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
    )


def _fences_and_lacs(output: str, fenced: set[int], lacs: dict[int, int]) -> None:
    for line in output.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "FENCED":
            fenced.add(int(words[1]))
        elif len(words) == 3 and words[0] == "LACPUSH":
            lacs[int(words[1])] = max(lacs.get(int(words[1]), -1), int(words[2]))


@pytest.mark.slow
async def test_acknowledged_data_survives_kill_9_during_work_and_during_the_start(
    tmp_path: Path,
) -> None:
    seed = int(os.environ.get("BKAIO_SEED", random.randrange(1 << 32)))
    print(f"BKAIO_SEED={seed}")
    history = History()
    fenced: set[int] = set()
    lacs: dict[int, int] = {}
    checked = 0
    try:
        for round_number in range(ROUNDS):
            output, _ = await _run_child(
                tmp_path, seed, round_number, "work", WORK_CACHE_BYTES, b"READY\n"
            )
            history.read_output(output)
            _fences_and_lacs(output, fenced, lacs)
            await _run_child(
                tmp_path, seed, round_number, "stall", STALL_CACHE_BYTES, b"REPLAY 1\n"
            )
            storage = await _open(tmp_path)
            try:
                base = round_number * 100
                ledgers = [base + task for task in (*range(TASKS), VICTIM, FENCED, LAC)]
                checked += await _check(storage, seed, history, ledgers)
                for ledger_id in fenced:
                    state = storage.ledger_state(ledger_id)
                    assert state is not None and state.fenced, f"fence of {ledger_id} lost"
                for ledger_id, pushed in lacs.items():
                    state = storage.ledger_state(ledger_id)
                    assert state is not None and state.explicit_lac <= pushed, (ledger_id, state)
            finally:
                await storage.close()
    except AssertionError as error:
        raise AssertionError(f"BKAIO_SEED={seed}: {error}") from error
    assert checked > 0 and fenced
