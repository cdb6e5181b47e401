"""`python -m bkaio.testing.sim`: run seeds of the deterministic simulation (`make sim`).

    python -m bkaio.testing.sim --seeds 1000 [--first-seed 0] [--jobs 2]
    python -m bkaio.testing.sim --seed 1234                        # one seed, its full report
    python -m bkaio.testing.sim --seeds 1000 --mutation ack_before_fsync   # must be caught
    python -m bkaio.testing.sim --seeds 10000 --mutation-checks 1000       # what make sim does

Without `--mutation`, every seed must pass: each failure prints its report and the one line
that replays it (`make sim SEED=...`), and the exit status is 1. With `--mutation M`, the run
stops at the first seed that catches the broken part and succeeds; it fails when no seed within
`--seeds` does. `--mutation-checks N` adds, after the seeds, one such search of up to N seeds per
known mutation. PYTHONHASHSEED is pinned to 0 (the process re-executes itself if needed): string
hashing is part of the schedule.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from bkaio.testing.sim.pool import Job, run_seeds, search_mutation
from bkaio.testing.sim.runner import MUTATIONS, SimOutcome, run_in_child
from bkaio.testing.sim.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", "bkaio.testing.sim", *args_list], env)
    parser = argparse.ArgumentParser(prog="python -m bkaio.testing.sim")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seeds", type=int, help="run this many seeds")
    which.add_argument("--seed", type=int, help="run one seed and print its report")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--mutation", choices=MUTATIONS)
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--mutation-checks",
        type=int,
        default=0,
        metavar="N",
        help="then check that each mutation is caught within N seeds",
    )
    parser.add_argument("--save", type=Path, help="write failing seeds' histories here")
    parser.add_argument(
        "--log",
        choices=["debug", "info", "warning", "error"],
        help="with --seed: print the real code's logs at this level (virtual time in t=)",
    )
    args = parser.parse_args(args_list)
    # Stopped: the workers and their directories go too (the pool's `finally`).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.seed is not None:
        return _one(args.seed, args.scenario, args.mutation, args.save, args.log)
    if args.mutation is not None:
        return _search(args.mutation, args.first_seed, args.seeds, args.scenario, args.jobs)
    status = _many(args.first_seed, args.seeds, args.scenario, args.jobs, args.save)
    for mutation in MUTATIONS if args.mutation_checks else ():
        status |= _search(mutation, args.first_seed, args.mutation_checks, None, args.jobs)
    return status


def _one(
    seed: int, scenario: str | None, mutation: str | None, save: Path | None, log: str | None
) -> int:
    if log is None:
        (outcome,) = run_seeds([(seed, scenario, mutation)], workers=1)
    else:  # Same schedule (the child starts from a fresh state too), logs on stdout.
        level = getattr(logging, log.upper())
        outcome = run_in_child(seed, scenario=scenario, mutation=mutation, log_level=level)
    print(outcome.report(limit=50))
    print(
        f"virtual {outcome.virtual_seconds:.3f} s, {outcome.callbacks} callbacks, "
        f"wall {outcome.wall_seconds:.3f} s, history digest {outcome.digest}"
    )
    _save(outcome, save)
    return 1 if outcome.failed else 0


def _many(first: int, count: int, scenario: str | None, jobs: int, save: Path | None) -> int:
    started = time.monotonic()
    totals: Counter[str] = Counter()
    scenarios: Counter[str] = Counter()
    failed: list[SimOutcome] = []
    outcomes = run_seeds(_jobs(first, count, scenario, None), workers=jobs)
    for done, outcome in enumerate(outcomes, start=1):
        scenarios[outcome.scenario] += 1
        for key in ("ops", "acknowledged", "lost", "violations"):
            totals[key] += outcome.result.stats.get(key, 0)
        if outcome.failed:
            failed.append(outcome)
            print(f"\nFAILED {outcome.report(limit=10)}\n", flush=True)
            _save(outcome, save)
        if done % 500 == 0:
            print(f"... {done}/{count} seeds, {len(failed)} failed", flush=True)
    seconds = time.monotonic() - started
    mix = ", ".join(f"{name} {n}" for name, n in sorted(scenarios.items()))
    print(
        f"sim: {count} seeds ({first}..{first + count - 1}), {len(failed)} failed, "
        f"{totals['ops']} operations, {totals['acknowledged']} acknowledged, "
        f"{totals['lost']} lost, {totals['violations']} violations; "
        f"{seconds:.1f} s on {jobs} jobs ({count / max(seconds, 1e-9):.1f} seeds/s)\n"
        f"sim: scenarios: {mix}"
    )
    for outcome in sorted(failed, key=lambda o: o.seed):
        print(f"sim: FAILED seed {outcome.seed} ({outcome.scenario}): {outcome.reproduce}")
    return 1 if failed else 0


def _search(mutation: str, first: int, limit: int, scenario: str | None, jobs: int) -> int:
    """Run seeds with `mutation` until one catches it (fails); 0 when one did."""
    started = time.monotonic()
    search = search_mutation(mutation, first, limit, scenario=scenario, workers=jobs)
    seconds = time.monotonic() - started
    caught = search.caught
    if caught is None:
        print(f"sim: mutation {mutation} NOT caught by seeds {first}..{first + limit - 1}")
        return 1
    kinds = sorted(caught.result.kinds()) or [caught.problem or "loop error"]
    print(
        f"sim: mutation {mutation} caught by seed {caught.seed} ({caught.scenario}: "
        f"{', '.join(kinds)}) after {search.seeds_run} seeds, {seconds:.1f} s; "
        f"replay: {caught.reproduce}"
    )
    return 0


def _jobs(first: int, count: int, scenario: str | None, mutation: str | None) -> Iterator[Job]:
    for seed in range(first, first + count):
        yield seed, scenario, mutation


def _save(outcome: SimOutcome, directory: Path | None) -> None:
    if directory is None or not outcome.history:
        return
    directory.mkdir(parents=True, exist_ok=True)
    suffix = f"-{outcome.mutation}" if outcome.mutation else ""
    path = directory / f"seed-{outcome.seed}{suffix}.jsonl"
    path.write_text(outcome.history)
    print(f"history: {path}")


if __name__ == "__main__":
    sys.exit(main())
