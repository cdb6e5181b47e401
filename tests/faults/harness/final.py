"""The final phase of every scenario, and the verdict.

`final_phase`: heal the network, SIGCONT and restart every bookie, then with a fresh direct
client recover (seal) every ledger, read 0..last entry one entry per history op (extra.final),
and read the metadata's sealed end. It has its own deadline: a liveness failure there is
reported apart from safety violations. `verdict` saves the history next to the test's tmp dir,
runs the checker and prints the seed, the schedule and the summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from bkaio.testing.checker import CheckResult, check
from bkaio.testing.history import History
from tests.faults.harness.cluster import FaultCluster
from tests.faults.harness.workload import PASSWORD, recover

READ_CHUNK = 256


@dataclass
class FinalReport:
    sealed: dict[int, int] = field(default_factory=dict)
    unrecovered: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def final_phase(
    cluster: FaultCluster,
    ledgers: list[int],
    *,
    deadline_seconds: float = 90.0,
    leave_down: frozenset[int] = frozenset(),
) -> FinalReport:
    """`leave_down`: bookies that must stay stopped (a refused start is the expected outcome)."""
    report = FinalReport()
    history = cluster.history
    cluster.heal_network()
    for index, bookie in enumerate(cluster.bookies.bookies):
        if bookie.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(bookie.pid, signal.SIGCONT)
        elif index not in leave_down:
            await cluster.bookies.start(index)
    bk = await cluster.client("final", proxied=False, read_timeout=5.0, add_timeout=5.0)

    async def one(ledger_id: int) -> None:
        last = await recover(history, bk, ledger_id, "final")
        if last is None:
            report.unrecovered.append(ledger_id)
            return
        report.sealed[ledger_id] = last
        md = await bk.get_ledger_metadata(ledger_id)
        inv = history.invoke("final-md", "seal", ledger_id)
        history.ok(inv, value=md.last_entry_id)
        handle = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        try:
            for first in range(0, last + 1, READ_CHUNK):
                end = min(last, first + READ_CHUNK - 1)
                invs = [
                    history.invoke("final", "read", ledger_id, entry=e, extra={"final": True})
                    for e in range(first, end + 1)
                ]
                try:
                    entries = await handle.read(first, end)
                except Exception as error:
                    for inv in invs:
                        history.failed(inv, error)
                    report.errors.append(f"ledger {ledger_id} read {first}..{end}: {error!r}")
                    continue
                by_id = {e.entry_id: e for e in entries}
                for inv in invs:
                    assert inv.entry is not None
                    got = by_id.get(inv.entry)
                    if got is None:
                        history.info(inv, "missing_from_range_read")
                    else:
                        history.ok(inv, value=got.payload.decode())
        finally:
            with contextlib.suppress(Exception):
                await handle.close()

    try:
        await asyncio.wait_for(asyncio.gather(*(one(lid) for lid in ledgers)), deadline_seconds)
    except TimeoutError:
        report.errors.append(f"final phase did not finish within {deadline_seconds} s (liveness)")
    finally:
        history.close_open("final-phase-ended")
        await cluster.close_client(bk)
    return report


def verdict(
    history: History, directory: Path, *, seed: int, schedule: str, name: str
) -> CheckResult:
    """Check the history; save it as JSONL; print what reproduces the run."""
    result = check(history.ops)
    path = directory / f"{name}-history.jsonl"
    path.write_text(history.to_jsonl())
    print(f"[{name}] BKAIO_SEED={seed} schedule: {schedule}")
    print(f"[{name}] history: {path}")
    print(f"[{name}] {result.summary()}")
    return result


async def finish(
    cluster: FaultCluster,
    ledgers: list[int],
    directory: Path,
    *,
    name: str,
    schedule: str,
    deadline_seconds: float = 90.0,
    leave_down: frozenset[int] = frozenset(),
) -> tuple[CheckResult, FinalReport]:
    """Final phase, then the checker: (result, final report)."""
    report = await final_phase(
        cluster, ledgers, deadline_seconds=deadline_seconds, leave_down=leave_down
    )
    result = verdict(cluster.history, directory, seed=cluster.seed, schedule=schedule, name=name)
    if report.errors or report.unrecovered:
        print(f"[{name}] final phase: unrecovered={report.unrecovered} errors={report.errors}")
    return result, report


def assert_safe(result: CheckResult, report: FinalReport, *, seed: int) -> None:
    """Safety first (never retried), then liveness of the final phase."""
    assert result.valid, f"BKAIO_SEED={seed}\n{result.summary()}"
    assert not report.unrecovered and not report.errors, (
        f"BKAIO_SEED={seed} liveness: unrecovered={report.unrecovered} errors={report.errors}"
    )
    assert not result.liveness, f"BKAIO_SEED={seed} liveness: {result.liveness}"
