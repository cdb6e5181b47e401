"""The simulated schedules. A seed picks a scenario and every number in it.

Each scenario has a writer and a tailing reader (every delivered entry must be in the final
ledger), and one kind of trouble:

| name                      | what happens                                                     |
| ---                       | ---                                                              |
| writer-crash              | the writer's process dies (power) mid-stream; another recovers   |
| dual-recovery             | two recoveries start together while the writer still writes      |
| slow-writer               | the writer's adds are held on some links while a recovery runs, |
|                           | fence requests may be lost; the held adds arrive afterwards      |
|                           | (the shapes of BookKeeper 2614/2615, randomized)                 |
| f8                        | BookKeeper 2614 exactly (reference F8, scripted)                 |
| ensemble-change-recovery  | a bookie of the ensemble dies or is cut off from the writer (an  |
|                           | ensemble change) while a recovery starts                         |
| bookie-crash-unsynced     | bookies lose power (unsynced writes lost, maybe torn), even all  |
|                           | at once, and restart; then the writer stops and a recovery runs  |
| fsync-failure             | an ensemble bookie's disk starts failing fsync (journal: it      |
|                           | exits and restarts; entry logs: it turns read-only)              |
| chaos                     | all of the above at random moments                               |

A scenario returns a one-line description of what the seed chose; the runner then calls the
cluster's final phase and the checker (bkaio.testing.sim.runner).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from bkaio.journal.crash_points import CRASH_POINTS
from bkaio.protocol import Flag, Op
from bkaio.testing.sim.cluster import SimCluster, SimOptions
from bkaio.testing.sim.disk import DiskModel
from bkaio.testing.sim.meta import LostAnswer
from bkaio.testing.sim.network import FrameRule, NetworkModel
from bkaio.testing.sim.nodes import SimBookie, SimClient
from bkaio.testing.sim.workload import WriterPlan, recoverer, tail_reader, writer

# The virtual seconds a scenario's troubled phase may last before the final phase starts.
PHASE_SECONDS = 20.0
QUORUMS = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (5, 3, 2), (4, 2, 2), (2, 2, 2)]

Scenario = Callable[[SimCluster, random.Random], Awaitable[str]]


def options_for(scenario: str, rng: random.Random) -> SimOptions:
    """The cluster a seed gets: quorums, sizes, network and disk behaviour."""
    quorum = rng.choice(QUORUMS)
    spare = rng.choice([0, 0, 1, 2])
    if scenario in ("ensemble-change-recovery", "fsync-failure"):
        spare = max(spare, 1)
    if scenario == "f8":
        quorum, spare = (3, 3, 2), 0
    network = NetworkModel(
        latency=(0.0001, rng.choice([0.001, 0.003, 0.01])),
        slow=rng.choice([0.0, 0.0, 0.02, 0.1]),
        split=rng.choice([0.0, 0.1]),
    )
    disk = DiskModel(
        sync_latency=(0.0001, rng.choice([0.001, 0.005])),
        slow_sync=rng.choice([0.0, 0.0, 0.05]),
        tear=rng.random() < 0.5,
    )
    return SimOptions(
        bookies=quorum[0] + spare,
        quorum=quorum,
        network=network,
        disk=disk,
        # Chaos loses more of them (one draw either way: the seed's other choices stay put).
        lost_metadata_answers=rng.choice(
            [0.0, 0.1, 0.3] if scenario == "chaos" else [0.0, 0.0, 0.1]
        ),
        # f8 is an exact schedule: its lost answers stay the applied kind, as they were.
        lost_metadata_kinds=(LostAnswer.APPLIED,) if scenario == "f8" else tuple(LostAnswer),
    )


def _plan(rng: random.Random, *, count: tuple[int, int] = (10, 120)) -> WriterPlan:
    return WriterPlan(
        count=rng.randint(*count),
        window=rng.choice([1, 2, 8, 32, 128]),
        pace=rng.choice([0.0, 0.001, 0.005]),
    )


class _Run:
    """The processes of one scenario and the tasks they run."""

    def __init__(self, cluster: SimCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.loop = asyncio.get_running_loop()
        self.created: asyncio.Future[int] = self.loop.create_future()
        self.work: list[tuple[asyncio.Task[Any], SimClient]] = []
        self.tails: list[asyncio.Task[Any]] = []
        self.nemesis: list[asyncio.TimerHandle] = []
        self.until = self.loop.time() + PHASE_SECONDS

    def client(self, name: str) -> SimClient:
        return self.cluster.client(name)

    def write(self, plan: WriterPlan, name: str = "w") -> SimClient:
        client = self.client(name)
        rng = random.Random(self.rng.random())
        task = client.spawn(writer(self.cluster, client, plan, self.created, rng), "write")
        self.work.append((task, client))
        return client

    def tail(self, name: str = "t") -> SimClient:
        client = self.client(name)
        task = client.spawn(tail_reader(self.cluster, client, self.created, self.until), "tail")
        self.tails.append(task)
        return client

    def recover(self, name: str, after: float) -> SimClient:
        client = self.client(name)

        async def later() -> None:
            await asyncio.sleep(after)
            await recoverer(self.cluster, client, self.created)

        self.work.append((client.spawn(later(), "recover"), client))
        return client

    async def ensemble(self) -> list[SimBookie]:
        """The bookies the writer's ledger was created on (none if its creation failed): a
        fault meant for the ledger must strike one of them, not a spare."""
        ledger_id = await self.ledger()
        if ledger_id is None:
            return []
        metadata = self.cluster.env.metadata_connection()
        try:
            ledger = await metadata.ledgers.get(ledger_id)
        finally:
            await metadata.close()
        return [self.cluster.bookie(bookie_id) for bookie_id in ledger.ensembles[0][1]]

    def at(self, delay: float, action: Callable[[], object]) -> None:
        """Run `action` (the nemesis, outside every process) `delay` virtual seconds from now,
        unless the troubled phase is over by then."""
        self.nemesis.append(self.loop.call_later(delay, action))

    async def ledger(self) -> int | None:
        try:
            return await self.created
        except Exception:
            return None

    async def settle(self, grace: float = 0.5, *, final: bool = True) -> None:
        """Wait until every writer and recoverer finished or its process died (at most until
        the phase ends), give the tail readers `grace` seconds more, then stop them; `final`:
        and end the troubled phase (`end`)."""
        # Polled (in virtual time): a process's death sets no event its tasks could await.
        while self.loop.time() < self.until and any(  # noqa: ASYNC110
            not task.done() and client.alive for task, client in self.work
        ):
            await asyncio.sleep(0.05)
        await asyncio.sleep(grace)
        if not final:
            return
        for task in self.tails:
            task.cancel()
        self.end()

    def end(self) -> None:
        """The troubled phase is over: no fault planned for later strikes the final phase."""
        for timer in self.nemesis:
            timer.cancel()
        for bookie in self.cluster.bookies:
            bookie.disarm_crash_point()


def _at_count(count: int, action: Callable[[], object], reached: int) -> None:
    if reached == count:
        action()


def _restart_armed(
    cluster: SimCluster, bookie: SimBookie, point: str, passes: int, power: bool
) -> None:
    """Restart `bookie` (now) with crash point `point` armed for its `passes`-th pass."""
    cluster.note(f"arm {point}:{passes} on {bookie.name}")
    cluster.crash_bookie(bookie, power_loss=False)
    bookie.arm_crash_point(point, passes, power_loss=power)
    cluster.restart_bookie(bookie)


def _pick_bookies(rng: random.Random, cluster: SimCluster, count: int) -> list[SimBookie]:
    return rng.sample(cluster.bookies, min(count, len(cluster.bookies)))


async def writer_crash(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng)
    w = run.write(plan)
    run.tail()
    crash_at = rng.uniform(0.005, 0.4)
    run.at(crash_at, partial(cluster.crash_client, w))
    recover_at = crash_at + rng.uniform(0.0, 0.3)
    run.recover("r", recover_at)
    await run.settle()
    return f"{plan} writer crash at {crash_at:.3f}, recovery at {recover_at:.3f}"


async def dual_recovery(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng)
    run.write(plan)
    run.tail()
    first = rng.uniform(0.005, 0.3)
    second = first + rng.choice([0.0, 0.0005, 0.003, 0.02])
    run.recover("r1", first)
    run.recover("r2", second)
    if rng.random() < 0.5:  # One recoverer's messages slowed: it may recover fewer entries.
        victim = rng.choice(cluster.bookies)
        run.at(first, partial(cluster.network.block, "r2", victim.name))
        run.at(first + rng.uniform(0.01, 0.5), partial(cluster.network.unblock, "r2", victim.name))
    await run.settle()
    return f"{plan} recoveries at {first:.3f} and {second:.3f}"


async def slow_writer(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng, count=(3, 40))
    run.write(plan)
    run.tail()
    network = cluster.network
    held = _pick_bookies(rng, cluster, rng.randint(1, cluster.options.quorum[1]))
    start = rng.uniform(0.0, 0.1)
    for bookie in held:
        run.at(start, partial(network.rules.append, FrameRule("w", bookie.name, Op.ADD_ENTRY)))
    lost_fence = rng.choice(cluster.bookies)
    network.rules.append(
        FrameRule("r", lost_fence.name, Op.READ_LAC, action="drop", flag=Flag.FENCE)
    )
    if rng.random() < 0.5:
        slow_read = rng.choice(cluster.bookies)
        network.rules.append(
            FrameRule("r", slow_read.name, Op.READ_ENTRY, action="delay", delay=rng.uniform(0, 1))
        )
    recover_at = start + rng.uniform(0.01, 0.2)
    run.recover("r", recover_at)
    release_at = recover_at + rng.uniform(0.0, 1.5)
    for bookie in held:
        run.at(release_at, partial(network.release, "w", bookie.name))
    run.at(release_at, network.rules.clear)
    await run.settle()
    return (
        f"{plan} adds held to {[b.name for b in held]} from {start:.3f}, fence to "
        f"{lost_fence.name} lost, recovery at {recover_at:.3f}, release at {release_at:.3f}"
    )


async def f8(cluster: SimCluster, rng: random.Random) -> str:
    """BookKeeper 2614: e0 reaches b2 only; the fence to b3 is lost; b2's recovery read is
    late; then the held add reaches b3."""
    run = _Run(cluster, rng)
    network = cluster.network
    b1, b2, b3 = cluster.bookies[:3]
    network.rules += [FrameRule("w", b1.name, Op.ADD_ENTRY), FrameRule("w", b3.name, Op.ADD_ENTRY)]
    network.rules.append(FrameRule("r", b3.name, Op.READ_LAC, action="drop", flag=Flag.FENCE))
    network.rules.append(FrameRule("r", b2.name, Op.READ_ENTRY, action="delay", delay=1.0))
    cluster.options.add_timeout = 30.0
    cluster.options.read_timeout = 5.0
    run.write(WriterPlan(count=1, window=1, pace=0.0))
    run.tail()
    ledger_id = await run.ledger()
    recovered = run.recover("r", 0.1)
    del recovered, ledger_id
    await asyncio.sleep(0.1 + rng.uniform(0.5, 2.0))
    network.release("w", b3.name)
    await asyncio.sleep(0.5)
    network.release("w", b1.name)
    await run.settle()
    return "scripted 2614 schedule"


async def ensemble_change_recovery(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng)
    run.write(plan)
    run.tail()
    ensemble = await run.ensemble()
    if not ensemble:
        return "ledger creation failed"
    victim = rng.choice(ensemble)
    fault_at = rng.uniform(0.0, 0.2)
    how = rng.choice(["crash", "power", "isolate", "cut-writer"])

    def fault() -> None:
        if how == "crash":
            cluster.crash_bookie(victim, power_loss=False)
        elif how == "power":
            cluster.crash_bookie(victim, power_loss=True)
        elif how == "isolate":
            cluster.isolate(victim)
        else:
            cluster.note(f"cut w from {victim.name}")
            cluster.network.block("w", victim.name)

    run.at(fault_at, fault)
    recover_at = fault_at + rng.uniform(-0.05, 0.3)
    run.recover("r", max(0.0, recover_at))
    if rng.random() < 0.5:
        back = fault_at + rng.uniform(0.1, 2.0)
        run.at(back, partial(cluster.restart_bookie, victim))
        run.at(back, cluster.network.heal)
    await run.settle()
    return f"{plan} {how} {victim.name} at {fault_at:.3f}, recovery at {recover_at:.3f}"


async def bookie_crash_unsynced(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng)
    # When: at a random moment, right after the k-th acknowledgement (the moment an
    # acknowledgement made before its fsync is exposed), or once all is quiet.
    when = rng.choice(["moment", "after-ack", "after-ack", "idle"])
    everyone = rng.random() < (0.8 if when == "after-ack" else 0.5)
    victims = cluster.bookies if everyone else _pick_bookies(rng, cluster, rng.randint(1, 2))
    # A rack losing power loses it everywhere at once; a staggered loss also happens.
    stagger = 0.0 if rng.random() < 0.7 else rng.choice([0.002, 0.02])
    downtime = [rng.uniform(0.05, 1.0) for _ in victims]

    def power_loss() -> None:
        for order, bookie in enumerate(victims):
            run.at(order * stagger, partial(cluster.crash_bookie, bookie, power_loss=True))
            run.at(order * stagger + downtime[order], partial(cluster.restart_bookie, bookie))

    if when == "after-ack":
        k = rng.randint(1, plan.count)
        plan.on_ack = partial(_at_count, k, power_loss)
    w = run.write(plan)
    run.tail()
    crash_at = rng.uniform(0.005, 0.4)
    writer_dies = when == "moment" and rng.random() < 0.5
    if when == "moment":
        run.at(crash_at, power_loss)
        if writer_dies:
            run.at(crash_at, partial(cluster.crash_client, w))
    elif when == "idle":
        await run.settle(grace=rng.uniform(0.0, 0.2), final=False)
        power_loss()
        crash_at = 0.0
    recover_at = crash_at + rng.uniform(0.1, 2.0)
    run.recover("r", recover_at)
    await run.settle()
    names = "all" if everyone else [b.name for b in victims]
    return (
        f"{plan} power loss of {names} {when} (at {crash_at:.3f}, stagger {stagger}), "
        f"writer dies: {writer_dies}, recovery at {recover_at:.3f}"
    )


async def fsync_failure(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng)
    run.write(plan)
    run.tail()
    ensemble = await run.ensemble()
    if not ensemble:
        await run.settle()
        return f"{plan} ledger creation failed"
    victim = rng.choice(ensemble)
    after, suffix = rng.randint(0, 30), rng.choice(["", ".jnl", ".log"])
    victim.disk.fail_syncs(after, suffix)
    recover_at = rng.uniform(0.05, 1.0)
    if rng.random() < 0.5:
        run.recover("r", recover_at)
    if rng.random() < 0.5:
        restart_at = rng.uniform(0.1, 1.0)
        run.at(restart_at, partial(cluster.crash_bookie, victim, power_loss=True))
        run.at(restart_at + 0.1, victim.disk.repair)
        run.at(restart_at + 0.1, partial(cluster.restart_bookie, victim))
    await run.settle()
    return f"{plan} {victim.name} fsync fails after {after} more syncs of '{suffix or '*'}' files"


async def chaos(cluster: SimCluster, rng: random.Random) -> str:
    run = _Run(cluster, rng)
    plan = _plan(rng, count=(10, 200))
    w = run.write(plan)
    run.tail()
    events: list[str] = []
    for _ in range(rng.randint(1, 6)):
        at = rng.uniform(0.0, 1.0)
        kind = rng.choice(["crash", "power", "isolate", "heal", "recover", "writer", "point"])
        bookie = rng.choice(cluster.bookies)
        events.append(f"{kind}@{at:.3f}:{bookie.name}")
        if kind in ("crash", "power"):
            run.at(at, partial(cluster.crash_bookie, bookie, power_loss=kind == "power"))
            run.at(at + rng.uniform(0.01, 1.0), partial(cluster.restart_bookie, bookie))
        elif kind == "isolate":
            run.at(at, partial(cluster.isolate, bookie))
        elif kind == "heal":
            run.at(at, cluster.network.heal)
        elif kind == "recover":
            run.recover(f"r{len(events)}", at)
        elif kind == "writer":
            run.at(at, partial(cluster.crash_client, w))
        else:  # Restarted with a crash point armed: it dies there, some passes later.
            point = rng.choice(CRASH_POINTS)
            passes, power = rng.randint(1, 20), rng.random() < 0.5
            run.at(at, partial(_restart_armed, cluster, bookie, point, passes, power))
            run.at(at + rng.uniform(0.5, 2.0), partial(cluster.restart_bookie, bookie))
    await run.settle()
    return f"{plan} events {events}"


SCENARIOS: dict[str, Scenario] = {
    "writer-crash": writer_crash,
    "dual-recovery": dual_recovery,
    "slow-writer": slow_writer,
    "f8": f8,
    "ensemble-change-recovery": ensemble_change_recovery,
    "bookie-crash-unsynced": bookie_crash_unsynced,
    "fsync-failure": fsync_failure,
    "chaos": chaos,
}


def pick(rng: random.Random) -> str:
    return rng.choice(sorted(SCENARIOS))
