"""Simulated recovery races (F8, F9, F10, F11) for thousands of seeds: the real ledger client
(`BookKeeper`, `LedgerHandle`, `LedgerRecovery`) over `SimBookieOps` on a `SimLoop`.

    outcome = run_seed("race", seed)        # or "f8" (the scripted 2614 schedule)
    outcome.result.valid, outcome.result.summary(), outcome.acked, outcome.ops

A seed fixes everything: cluster size, quorums, workload, faults and their timing. The same seed
replays the same schedule exactly (same code, same PYTHONHASHSEED; the soak runner sets it to 0).
What is simulated and what is real: see bkaio/testing/sim/cluster.py and docs/faults.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from bkaio.errors import BKError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.ledger_client.recovery import FENCED_RECOVERY_READS, RecoveryReadPolicy
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta.bookies import BookieInfo
from bkaio.testing.checker import CheckResult, check
from bkaio.testing.history import History
from bkaio.testing.sim.cluster import (
    SimBookie,
    SimBookieOps,
    SimFaults,
    SimLedgerStore,
    SimNetwork,
    SimRule,
)
from bkaio.testing.sim.loop import SimDeadlockError, run_simulation

PASSWORD = b"sim"


@dataclass(frozen=True, slots=True)
class SimOutcome:
    scenario: str
    seed: int
    result: CheckResult
    description: str
    liveness_error: str | None = None

    @property
    def acked(self) -> int:
        return self.result.stats.get("acknowledged", 0)

    @property
    def ops(self) -> int:
        return self.result.stats.get("ops", 0)


class _Sim:
    """One simulated cluster: bookies, network, metadata, clients, history."""

    def __init__(
        self, seed: int, bookies: int, faults: SimFaults, recovery_reads: RecoveryReadPolicy
    ) -> None:
        self.rng = random.Random(seed)
        self.recovery_reads = recovery_reads  # Every client's (a mutation check's: broken).
        self.history = History(clock=lambda: asyncio.get_running_loop().time())
        self.bookies = [SimBookie(f"10.0.0.{i + 1}:3181") for i in range(bookies)]
        self.network = SimNetwork(random.Random(self.rng.random()), self.bookies, faults)
        self.store = SimLedgerStore(random.Random(self.rng.random()))
        self.clients: list[BookKeeper] = []

    def client(
        self, name: str, *, add_timeout: float = 0.5, read_timeout: float = 0.5
    ) -> BookKeeper:
        config = ClientConfig(
            add_timeout=add_timeout,
            read_timeout=read_timeout,
            client_id=name,
            explicit_lac_interval=0.0,
        )
        ops = SimBookieOps(self.network, name, add_timeout=add_timeout, read_timeout=read_timeout)
        bk = BookKeeper(
            ledgers=self.store,
            ops=ops,
            config=config,
            rng=random.Random(self.rng.random()),
            recovery_reads=self.recovery_reads,
        )
        bk.set_bookies(
            [
                BookieInfo(bookie_id=b.bookie_id, host=b.bookie_id.split(":")[0], port=3181)
                for b in self.bookies
            ]
        )
        self.clients.append(bk)
        return bk

    async def write(self, handle: LedgerHandle, process: str, count: int, window: int) -> None:
        """Pipelined appends recorded in the history, until `count` or the handle fails."""
        inflight: set[asyncio.Future[int]] = set()
        for seq in range(count):
            while len(inflight) >= window:
                await asyncio.wait(set(inflight), return_when=asyncio.FIRST_COMPLETED)
            value = f"{process}-{handle.ledger_id}-{seq}"
            inv = self.history.invoke(process, "add", handle.ledger_id, value=value)
            try:
                future = handle.append(value.encode())
            except BKError as error:
                self.history.failed(inv, error)
                break

            def done(f: asyncio.Future[int], inv: Any = inv) -> None:
                inflight.discard(f)
                if f.cancelled():
                    self.history.info(inv, "cancelled")
                elif f.exception() is not None:
                    self.history.failed(inv, f.exception())  # type: ignore[arg-type]
                else:
                    self.history.ok(inv, entry=f.result())

            future.add_done_callback(done)
            inflight.add(future)
            await asyncio.sleep(self.rng.uniform(0.0, 0.002))
        if inflight:
            await asyncio.wait(set(inflight), timeout=30.0)

    async def recover(self, bk: BookKeeper, ledger_id: int, process: str) -> int | None:
        inv = self.history.invoke(process, "seal", ledger_id)
        try:
            handle = await asyncio.wait_for(bk.open_ledger(ledger_id, PASSWORD, recovery=True), 30)
        except (BKError, TimeoutError) as error:
            self.history.failed(inv, error)
            return None
        self.history.ok(inv, value=handle.last_entry_id)
        return int(handle.last_entry_id)

    async def final(self, ledger_id: int) -> str | None:
        """Heal, recover with a fresh client and read everything; a liveness problem or None."""
        self.network.heal()
        bk = self.client("final", add_timeout=2.0, read_timeout=2.0)
        last = await self.recover(bk, ledger_id, "final")
        if last is None:
            return "final recovery failed"
        handle = await bk.open_ledger(ledger_id, PASSWORD, recovery=False)
        invs = [
            self.history.invoke("final", "read", ledger_id, entry=e, extra={"final": True})
            for e in range(last + 1)
        ]
        try:
            entries = await handle.read(0, last) if last >= 0 else []
        except BKError as error:
            for inv in invs:
                self.history.failed(inv, error)
            return f"final read failed: {error}"
        for inv, entry in zip(invs, entries, strict=True):
            self.history.ok(inv, value=entry.payload.decode())
        return None

    async def close(self) -> None:
        for bk in self.clients:
            with contextlib.suppress(Exception):
                await bk.close()


async def _race(seed: int, recovery_reads: RecoveryReadPolicy) -> tuple[History, str, str | None]:
    """Random quorums and faults; a writer; one or two recoverers at random moments; bookies
    going down and up; lost, slow and reordered messages; lost metadata replies."""
    rng = random.Random(seed)
    quorums = rng.choice([(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (5, 3, 2), (4, 2, 2)])
    bookies = quorums[0] + rng.choice([0, 0, 1, 2])
    faults = SimFaults(loss=rng.choice([0.0, 0.0, 0.01, 0.05]), slow=rng.choice([0.0, 0.05, 0.2]))
    sim = _Sim(seed, bookies, faults, recovery_reads)
    sim.store.unknown_outcome = rng.choice([0.0, 0.0, 0.2])
    count, window = rng.randrange(5, 120), rng.choice([1, 4, 16, 64])
    recoverers = 2 if rng.random() < 0.4 else 1
    description = (
        f"E/Qw/Qa={quorums} bookies={bookies} loss={faults.loss} slow={faults.slow} "
        f"unknown_cas={sim.store.unknown_outcome} entries={count} window={window} "
        f"recoverers={recoverers}"
    )
    writer = sim.client("w")
    try:
        handle = await writer.create_ledger(*quorums, password=PASSWORD)
    except BKError as error:
        return sim.history, description, f"create failed: {error}"
    ledger_id = handle.ledger_id

    async def nemesis() -> None:
        for _ in range(rng.randrange(0, 4)):
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            victim = rng.choice(sim.bookies).bookie_id
            sim.network.down.add(victim)
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            sim.network.down.discard(victim)

    async def recoverer(name: str) -> None:
        await asyncio.sleep(rng.uniform(0.0, 0.4))
        await sim.recover(sim.client(name), ledger_id, name)

    tasks = [asyncio.ensure_future(sim.write(handle, "w", count, window))]
    tasks.append(asyncio.ensure_future(nemesis()))
    tasks += [asyncio.ensure_future(recoverer(f"r{i}")) for i in range(recoverers)]
    await asyncio.wait(tasks, timeout=120.0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    sim.history.close_open("simulation-phase-ended")
    problem = await sim.final(ledger_id)
    await sim.close()
    return sim.history, description, problem


async def _f8(seed: int, recovery_reads: RecoveryReadPolicy) -> tuple[History, str, str | None]:
    """BookKeeper 2614, scripted: e0 reaches b2 only; the fence to b3 is lost; b2's recovery
    read is late; then the held add reaches b3."""
    sim = _Sim(seed, 3, SimFaults(), recovery_reads)
    writer = sim.client("w", add_timeout=30.0)
    handle = await writer.create_ledger(3, 3, 2, password=PASSWORD)
    b1, b2, b3 = handle.metadata.ensembles[0][1]
    net = sim.network
    net.rules += [SimRule("w", b1, "add"), SimRule("w", b3, "add")]
    net.rules.append(SimRule("r", b3, "read_lac", action="drop", fence_only=True))
    net.rules.append(SimRule("r", b2, "read", action="delay", delay=1.0))
    write = asyncio.ensure_future(sim.write(handle, "w", 1, 1))
    await asyncio.sleep(0.1)
    await sim.recover(sim.client("r", read_timeout=5.0), handle.ledger_id, "r")
    net.release("w", b3)
    await asyncio.sleep(0.5)
    net.release("w", b1)
    await write
    problem = await sim.final(handle.ledger_id)
    await sim.close()
    return sim.history, "scripted 2614 schedule", problem


ScenarioRun = Coroutine[Any, Any, tuple[History, str, str | None]]
SCENARIOS: dict[str, Callable[[int, RecoveryReadPolicy], ScenarioRun]] = {
    "race": _race,
    "f8": _f8,
}


def run_seed(
    scenario: str, seed: int, *, recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS
) -> SimOutcome:
    """Run one seed of `scenario` on a fresh virtual-time loop and check its history.
    `recovery_reads`: every simulated client's policy (a mutation check passes a broken one)."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        try:
            history, description, problem = run_simulation(
                SCENARIOS[scenario](seed, recovery_reads)
            )
        except SimDeadlockError as error:
            empty = check([])
            return SimOutcome(scenario, seed, empty, "deadlock", str(error))
    finally:
        structlog.configure(**old)
    result = check(history.ops, require_final=False)
    return SimOutcome(scenario, seed, result, description, problem)
