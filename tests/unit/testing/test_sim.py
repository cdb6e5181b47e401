"""The deterministic simulation of the real bookie and client code, over many seeds.

Each seed runs real `ShardServer`s, `ShardStorage`s and journals, and a real `BookKeeper`,
on the simulated loop, network, disks and metadata (docs/faults.md, "Deterministic
simulation"); the history checker judges every seed. The runner is the same command as
`make sim` (`python -m bkaio.testing.sim`), in a subprocess with PYTHONHASHSEED pinned.
BKAIO_SIM_SEEDS / BKAIO_SEED change how many seeds and from where.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bkaio.testing.checker import KINDS
from bkaio.testing.sim.runner import MUTATIONS, run_in_child

SEEDS = int(os.environ.get("BKAIO_SIM_SEEDS", "300"))
FIRST = int(os.environ.get("BKAIO_SEED", "0"))
# `make sim` checks the full bound (1000 seeds); the suite a smaller one.
MUTATION_BOUND = 300
REPO = Path(__file__).resolve().parents[3]


def _sim(*args: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bkaio.testing.sim", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_seed_keeps_every_guarantee() -> None:
    done = _sim("--seeds", str(SEEDS), "--first-seed", str(FIRST))
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert f"sim: {SEEDS} seeds" in done.stdout and " 0 failed" in done.stdout
    for scenario in (
        "writer-crash",
        "dual-recovery",
        "slow-writer",
        "f8",
        "ensemble-change-recovery",
        "bookie-crash-unsynced",
        "fsync-failure",
        "chaos",
    ):
        assert re.search(rf"\b{scenario} [1-9]", done.stdout), f"no seed ran {scenario}"


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_each_broken_part_is_caught(mutation: str) -> None:
    done = _sim("--seeds", str(MUTATION_BOUND), "--mutation", mutation)
    print(done.stdout[-2000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    caught = re.search(r"caught by seed (\d+) \(([\w-]+): ([^)]+)\)", done.stdout)
    assert caught is not None, done.stdout
    # Caught by the checker (a guarantee broken), not by a run that merely failed to finish.
    assert set(caught.group(3).split(", ")) <= set(KINDS), caught.group(3)


def test_a_failing_seed_prints_the_line_that_replays_it() -> None:
    done = _sim("--seeds", str(MUTATION_BOUND), "--mutation", "unfenced_recovery_reads")
    caught = re.search(
        r"replay: (make sim SEED=(\d+) MUTATION=unfenced_recovery_reads)", done.stdout
    )
    assert caught is not None, done.stdout
    replay = _sim("--seed", caught.group(2), "--mutation", "unfenced_recovery_reads")
    assert replay.returncode == 1
    assert f"reproduce: {caught.group(1)}" in replay.stdout
    assert "VIOLATION lost-acked-write" in replay.stdout


def test_a_seed_replays_exactly_alone_or_among_others() -> None:
    digests = {}
    for seed in (FIRST + 3, FIRST + 11):
        alone = _sim("--seed", str(seed))
        again = _sim("--seed", str(seed))
        digest = re.search(r"history digest (\w+)", alone.stdout)
        assert digest is not None, alone.stdout
        assert f"history digest {digest.group(1)}" in again.stdout
        digests[seed] = digest.group(1)
    # From another process state altogether: the same schedule, to the byte.
    assert run_in_child(FIRST + 3).digest == digests[FIRST + 3]


def test_a_failing_journal_ends_its_bookie_and_a_failing_flush_makes_it_read_only() -> None:
    """As in the worker: a journal whose write or sync failed ends the process (restarted
    later), a failed entry-log flush makes the bookie read-only; no guarantee breaks."""
    outcomes = [run_in_child(seed, scenario="fsync-failure") for seed in range(12)]
    assert not [outcome.report() for outcome in outcomes if outcome.failed]
    notes = [note for outcome in outcomes for note in outcome.notes]
    assert any("exited: JournalFailedExit" in note for note in notes), notes
    assert any("read-only: storage failed" in note for note in notes), notes
    assert "make sim SEED=2 SCENARIO=fsync-failure" in outcomes[2].report()
