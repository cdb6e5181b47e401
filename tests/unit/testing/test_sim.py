"""The deterministic simulator: the real client's recovery under seeded schedules (A4)."""

from __future__ import annotations

import os

import pytest

from bkaio.testing.mutations import UNFENCED_RECOVERY_READS
from bkaio.testing.sim.loop import SimDeadlockError, SimLoop, run_simulation
from bkaio.testing.sim.scenarios import run_seed

SEEDS = int(os.environ.get("BKAIO_SIM_SEEDS", "150"))
BASE = int(os.environ.get("BKAIO_SEED", "0"))


def test_virtual_time_moves_only_when_everything_waits() -> None:
    import asyncio

    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        return loop.time()

    assert run_simulation(main()) == pytest.approx(3600)


def test_a_deadlock_is_reported() -> None:
    import asyncio

    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(SimDeadlockError):
        run_simulation(main())
    loop = SimLoop()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()


def test_scripted_2614_schedule_keeps_acked_writes() -> None:
    outcome = run_seed("f8", BASE)
    assert outcome.result.valid, outcome.result.summary()
    assert outcome.liveness_error is None


def test_scripted_2614_schedule_catches_unfenced_recovery_reads() -> None:
    outcome = run_seed("f8", BASE, recovery_reads=UNFENCED_RECOVERY_READS)
    assert "lost-acked-write" in outcome.result.kinds(), outcome.result.summary()


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed("race", BASE + 7), run_seed("race", BASE + 7)
    assert first.result == second.result and first.description == second.description


def test_recovery_races_over_many_seeds() -> None:
    failures = []
    for seed in range(BASE, BASE + SEEDS):
        outcome = run_seed("race", seed)
        if not outcome.result.valid or outcome.liveness_error:
            failures.append(
                f"BKAIO_SEED={seed} {outcome.description}: {outcome.liveness_error}\n"
                f"{outcome.result.summary(5)}"
            )
    assert not failures, "\n".join(failures[:5])
