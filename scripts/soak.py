"""Soak runner: every fault scenario for many seeds, plus thousands of simulator seeds.

    .venv/bin/python scripts/soak.py [--seeds 3] [--sim-seeds 2000] [-k EXPR] [--first-seed N]
                                     [--minutes M]

With --minutes, rounds of real scenarios (each round: every scenario once per seed, fresh seeds
every round) repeat until M minutes have passed, so a soak has a wall-clock length, not a count.

Each real scenario runs as its own pytest process with BKAIO_SOAK=1 and BKAIO_SEED=<seed>, so a
crash or hang stays contained and any failure is replayed with the printed command. The
simulator's seeds run in processes forked from this one (bkaio.testing.sim.pool; PYTHONHASHSEED
is pinned to 0 so seeds replay exactly, each with `make sim SEED=...`). Prints
one table: scenario, seeds, operations, acknowledged, lost (must be 0), violations, failed runs.
Exits non-zero when anything was lost, violated or failed.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "tests" / "faults" / "scenarios"
FAILURE_LOGS = Path(os.environ.get("TMPDIR", "/tmp")) / "bkaio-soak-failures"
_STATS = re.compile(r"^\[(?P<name>[^\]]+)\] stats: (?P<stats>\{.*\})$", re.M)


@dataclass
class Row:
    seeds: int = 0
    ops: int = 0
    acknowledged: int = 0
    lost: int = 0
    violations: int = 0
    failed_runs: int = 0
    failures: list[str] = field(default_factory=list)


def _collect(expression: str | None) -> list[str]:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", str(SCENARIOS)]
    if expression:
        command += ["-k", expression]
    env = {**os.environ, "BKAIO_SOAK": "1"}
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "::" in line]


def _run_real(test_id: str, seed: int, rows: dict[str, Row], timeout: float) -> None:
    env = {**os.environ, "BKAIO_SOAK": "1", "BKAIO_SEED": str(seed)}
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", test_id]
    try:
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = str(expired.stdout or ""), -1
    label = test_id.split("::")[-1]
    seen = False
    for match in _STATS.finditer(output):
        stats = ast.literal_eval(match.group("stats"))
        row = rows[f"{label}"]
        row.ops += stats.get("ops", 0)
        row.acknowledged += stats.get("acknowledged", 0)
        row.lost += stats.get("lost", 0)
        row.violations += stats.get("violations", 0)
        seen = True
    row = rows[label]
    row.seeds += 1
    if code not in (0, 5):  # 5: everything skipped (e.g. no root for a tmpfs).
        row.failed_runs += 1
        # Keep what the run printed: a failure must be explainable after the fact.
        FAILURE_LOGS.mkdir(parents=True, exist_ok=True)
        saved = FAILURE_LOGS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', label)}-{seed}.log"
        saved.write_text(output)
        row.failures.append(
            f"BKAIO_SOAK=1 BKAIO_SEED={seed} pytest -s '{test_id}'  (output: {saved})"
        )
    if not seen and code == 0:
        pass  # Tests that check without a history (none today) still count their seeds.


def _run_sim(seeds: int, first: int, rows: dict[str, Row]) -> None:
    """The deterministic simulation (bkaio.testing.sim): `seeds` seeds that must all pass, and
    each mutation, which must be caught (some seed fails) within min(seeds, 1000) seeds."""
    from bkaio.testing.sim.pool import run_seeds, search_mutation
    from bkaio.testing.sim.runner import MUTATIONS

    jobs = min(2, os.cpu_count() or 1)
    row = rows["sim"]
    for outcome in run_seeds(((s, None, None) for s in range(first, first + seeds)), workers=jobs):
        row.seeds += 1
        row.ops += outcome.result.stats.get("ops", 0)
        row.acknowledged += outcome.result.stats.get("acknowledged", 0)
        row.lost += outcome.result.lost
        row.violations += len(outcome.result.violations)
        if outcome.failed:
            row.failed_runs += 1
            row.failures.append(f"{outcome.reproduce}  # {outcome.scenario}")
    for mutation in MUTATIONS:
        row = rows[f"sim-mutation-{mutation}"]
        limit = min(seeds, 1000)
        search = search_mutation(mutation, first, limit, workers=jobs)
        for outcome in search.outcomes:
            row.seeds += 1
            row.ops += outcome.result.stats.get("ops", 0)
            row.acknowledged += outcome.result.stats.get("acknowledged", 0)
            row.lost += outcome.result.lost
            row.violations += len(outcome.result.violations)
        if search.caught is None:
            row.failed_runs += 1
            row.failures.append(
                f"make sim SEEDS={limit} MUTATION={mutation}  # mutation not caught"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="seeds per real scenario")
    parser.add_argument("--sim-seeds", type=int, default=2000, help="simulator seeds")
    parser.add_argument("--first-seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("-k", dest="expression", default=None, help="pytest -k filter")
    parser.add_argument("--timeout", type=float, default=600.0, help="per scenario run, seconds")
    parser.add_argument(
        "--minutes", type=float, default=0.0, help="repeat rounds until this long has passed"
    )
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # Simulator seeds replay only with it pinned.
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"}
        )
    rows: dict[str, Row] = defaultdict(Row)
    started = time.monotonic()
    if args.sim_seeds:
        _run_sim(args.sim_seeds, args.first_seed, rows)
    test_ids = _collect(args.expression) if args.seeds else []
    deadline = started + args.minutes * 60.0
    first = args.first_seed
    rounds = 0
    while test_ids:
        rounds += 1
        for seed in range(first, first + args.seeds):
            for test_id in test_ids:
                _run_real(test_id, seed, rows, args.timeout)
                elapsed = (time.monotonic() - started) / 60.0
                print(
                    f"  [{elapsed:5.1f} min] round {rounds} {test_id.split('::')[-1]}"
                    f" seed {seed}: done",
                    file=sys.stderr,
                    flush=True,
                )
        first += args.seeds
        if time.monotonic() >= deadline:
            break
    header = (
        f"{'scenario':58} {'seeds':>6} {'operations':>11} {'acked':>9} {'lost':>5} "
        f"{'viol':>5} {'failed':>6}"
    )
    print(header)
    print("-" * len(header))
    bad = False
    for name in sorted(rows):
        row = rows[name]
        print(
            f"{name:58} {row.seeds:>6} {row.ops:>11} {row.acknowledged:>9} {row.lost:>5} "
            f"{row.violations:>5} {row.failed_runs:>6}"
        )
        expected_violations = "mutation" in name  # Mutation checks must find violations.
        if row.failed_runs or (row.lost and not expected_violations):
            bad = True
    print(
        f"first seed {args.first_seed}; {rounds} round(s) of real scenarios;"
        f" {time.monotonic() - started:.0f} s ({(time.monotonic() - started) / 60:.1f} min)"
    )
    for name in sorted(rows):
        for failure in rows[name].failures[:3]:
            print(f"FAILED {name}: {failure}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
