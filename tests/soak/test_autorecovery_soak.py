"""Autorecovery soak (30 minutes by default; `make soak`, never in `make test`).

Five real bookies on a real etcd, each running the autorecovery service (lost-bookie delay
5 s) and GC. Writers create ledgers without pause (E3/Qw2/Qa2 and E3/Qw3/Qa2), append, close.
Meanwhile a nemesis picks at random every few seconds: kill -9 a bookie (restarted after 1 to
40 s, so some outlive the delay and are re-replicated, then come back over-replicated), a
SIGTERM restart, a decommission (recommissioned later), or a reformat (stop, `bkaio bookie
format --force`, start: the bookie comes back in limbo; only while no bookie is down or in
limbo, so that one disk is lost at a time) — never leaving fewer than three bookies up. When
the time is up the faults stop, every bookie is started and recommissioned, and the soak waits
until nothing is under-replicated, no ledger names a bookie that is not registered, no live
bookie lacks entries of its fragments (the ledger check), and no bookie is in limbo. Then:
every acknowledged entry reads back with its payload, every ledger is sealed at or after its
last acknowledged entry, and every entry is on every bookie of its write set.

    BKAIO_SOAK=1 BKAIO_SOAK_MINUTES=30 BKAIO_SEED=7 .venv/bin/python -m pytest tests/soak -s

When the heal check fails it leaves evidence: the bookies' logs are copied to
$BKAIO_SOAK_EVIDENCE (default /tmp/bkaio-soak-<seed>-<time>/, outside pytest's tmp dirs, which
later runs delete), and the failure message lists the marks still present (with their
missing and incomplete bookies and locks), the short ledger's segments and the entries it
lacks, and each bookie's autorecovery counters (skipped checks, marks kept, failures).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bkaio.autorecovery import (
    AutorecoveryMetrics,
    LedgerChecker,
    decommission_bookie,
    list_under_replicated,
    recommission_bookie,
)
from bkaio.autorecovery.cluster import ClusterView
from bkaio.errors import BKError
from bkaio.ledger_client import BookKeeper
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, BookieProcess
from tests.fixtures.etcd import EtcdServer
from tests.integration.autorecovery.helpers import (
    bkaio_cli,
    bookie_metrics,
    metric_sum,
    verify_full_replication,
)

MINUTES = float(os.environ.get("BKAIO_SOAK_MINUTES", "30"))
SEED = int(os.environ.get("BKAIO_SEED", str(random.randrange(1 << 30))))
BOOKIES = 5
MIN_UP = 3
PASSWORD = b"soak"
SETTLE_SECONDS = 600.0  # After the faults stop: time allowed to heal completely.

CONFIG: dict[str, dict[str, Any]] = {
    "autorecovery": {
        "lost_bookie_delay_seconds": 5.0,
        "audit_interval_seconds": 60.0,
        "ledger_check_interval_seconds": 15.0,
        "auditor_lease_ttl_seconds": 3.0,
        "worker_lease_ttl_seconds": 3.0,
        "open_ledger_grace_seconds": 5.0,
        "retry_backoff_seconds": 0.5,
        "retry_backoff_max_seconds": 10.0,
        "poll_interval_seconds": 1.0,
    },
    "gc": {"interval_seconds": 30.0, "grace_seconds": 10.0, "overreplicated_grace_seconds": 20.0},
    "storage": {"entry_log_max_bytes": 4 << 20},
    "log": {"level": "info"},
}


@dataclass
class Written:
    """What the writers were told: acknowledged payloads by ledger and entry id."""

    acked: dict[int, dict[int, bytes]] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    failures: Counter[str] = field(default_factory=Counter)


@dataclass
class Nemesis:
    cluster: BookieCluster
    rng: random.Random
    down: set[int] = field(default_factory=set)
    decommissioned: set[int] = field(default_factory=set)
    actions: Counter[str] = field(default_factory=Counter)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    locks: dict[int, asyncio.Lock] = field(default_factory=dict)

    def up(self) -> list[int]:
        return [i for i in range(BOOKIES) if i not in self.down]

    def later(self, delay: float, action: Any) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await action()

        task = asyncio.ensure_future(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def start(self, index: int) -> None:
        async with self.locks.setdefault(index, asyncio.Lock()):
            if index not in self.down:
                return
            if self.cluster[index].running:  # A start cancelled half-way (the faults ended).
                await self.cluster.wait_until_registered(index)
            else:
                await self.cluster.start(index)
            self.down.discard(index)

    async def step(self) -> None:
        rng = self.rng
        candidates = [i for i in self.up() if i not in self.decommissioned]
        if len(self.up()) <= MIN_UP or not candidates:
            return
        index = rng.choice(candidates)
        roll = rng.random()
        if roll < 0.45:
            self.actions["kill -9"] += 1
            self.down.add(index)
            self.cluster.kill9(index)
            self.later(rng.uniform(1.0, 40.0), lambda: self.start(index))
        elif roll < 0.65:
            self.actions["restart"] += 1
            self.down.add(index)
            await self.cluster.stop(index)
            self.later(rng.uniform(0.5, 5.0), lambda: self.start(index))
        elif roll < 0.85 and not self.decommissioned:
            self.actions["decommission"] += 1
            self.decommissioned.add(index)
            self.later(0.0, lambda: self.decommission(index))
        elif len(self.down) == 0:
            # One lost disk at a time: a second reformat while the first bookie's ledgers are
            # still in limbo can wipe both copies of a Qw2 entry, a loss beyond what any
            # replication factor promises (seen with seed 576989886: recovery rightly
            # refused to decide an entry both its bookies had lost).
            if await self._any_in_limbo():
                self.actions["reformat skipped: a bookie in limbo"] += 1
                return
            self.actions["reformat"] += 1
            self.down.add(index)
            await self.cluster.stop(index)
            config = str(self.cluster[index].config_path)
            formatted = await bkaio_cli("bookie", "format", "--config", config, "--force")
            assert formatted.returncode == 0, formatted.stderr
            self.later(rng.uniform(0.5, 10.0), lambda: self.start(index))

    async def _any_in_limbo(self) -> bool:
        for index in self.up():
            try:
                if await _limbo_ledgers(self.cluster[index]):
                    return True
            except OSError:
                return True  # Not answering: assume the worst, reformat another time.
        return False

    async def decommission(self, index: int) -> None:
        bookie_id = self.cluster.bookie_ids[index]
        try:
            report = await decommission_bookie(
                self.cluster.metadata_uri,
                bookie_id,
                admin_token=self.cluster.admin_token,
                open_ledger_grace_seconds=10.0,
                timeout_seconds=300.0,
            )
            self.actions[f"decommission {'done' if report.complete else 'incomplete'}"] += 1
        except BKError as error:  # A bookie killed meanwhile, etcd busy: counted, not fatal.
            self.actions[f"decommission failed: {type(error).__name__}"] += 1
        self.later(self.rng.uniform(5.0, 30.0), lambda: self.recommission(index))

    async def recommission(self, index: int) -> None:
        await recommission_bookie(self.cluster.metadata_uri, self.cluster.bookie_ids[index])
        self.decommissioned.discard(index)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for index in range(BOOKIES):
            await self.start(index)
            await recommission_bookie(self.cluster.metadata_uri, self.cluster.bookie_ids[index])
        self.decommissioned.clear()


async def _writer(
    number: int, uri: str, written: Written, stop: asyncio.Event, rng: random.Random
) -> None:
    async with BookKeeper.connect(uri, add_timeout=10.0) as bk:
        while not stop.is_set():
            shape = (3, 3, 2) if rng.random() < 0.5 else (3, 2, 2)
            try:
                handle = await bk.create_ledger(*shape, password=PASSWORD)
            except BKError as error:
                written.failures[f"create: {type(error).__name__}"] += 1
                await asyncio.sleep(1.0)
                continue
            acked = written.acked.setdefault(handle.ledger_id, {})
            count = rng.randrange(50, 400)
            try:
                for first in range(0, count, 20):
                    payloads = [
                        b"w%d-%d-%d-" % (number, handle.ledger_id, first + i)
                        + bytes(rng.randrange(256) for _ in range(32))
                        for i in range(20)
                    ]
                    ids = await asyncio.gather(*(handle.append(p) for p in payloads))
                    for entry_id, payload in zip(ids, payloads, strict=True):
                        acked[entry_id] = payload
                    await asyncio.sleep(rng.uniform(0.0, 0.05))
                await handle.close()
                written.closed.add(handle.ledger_id)
            except BKError as error:  # Fenced, no bookies: the ledger is recovered at the end.
                written.failures[f"append: {type(error).__name__}"] += 1
                await asyncio.sleep(0.5)


async def _healed(cluster: BookieCluster, checker: LedgerChecker) -> str | None:
    """Why the cluster is not healed yet (None: healed)."""
    meta = await cluster.metadata()
    if marks := await list_under_replicated(meta):
        return f"{len(marks)} ledgers under-replicated"
    registered = set((await cluster.registered()).keys())
    async for ledger_id in meta.ledgers.list_ids():
        md = await meta.ledgers.get(ledger_id)
        missing = {b for _, ensemble in md.ensembles for b in ensemble} - registered
        if missing:
            return f"ledger {ledger_id} names {sorted(missing)}, not registered"
        check = await checker.check(md, registered)
        if check.incomplete:
            lacking = {b: (len(ids), ids[:5]) for b, ids in check.incomplete.items()}
            return (
                f"ledger {ledger_id} short on {sorted(check.incomplete)}: (count, first ids) "
                f"{lacking}; segments {list(md.ensembles)}, E{md.ensemble_size}/"
                f"Qw{md.write_quorum}/Qa{md.ack_quorum}, last entry {md.last_entry_id}"
            )
        if check.unchecked:
            return f"ledger {ledger_id} could not be checked: {check.unchecked}"
    for bookie in cluster.bookies:
        if limbo := await _limbo_ledgers(bookie):
            return f"{bookie.bookie_id} has {limbo:.0f} ledgers in limbo"
    return None


_EVIDENCE_METRICS = (
    "bkaio_autorecovery_ledger_check_skipped_total",
    "bkaio_autorecovery_ledgers_unchecked",
    "bkaio_autorecovery_marks_kept_total",
    "bkaio_autorecovery_replication_failures_total",
    "bkaio_autorecovery_ledgers_marked_total",
    "bkaio_autorecovery_is_auditor",
    "bkaio_task_failures_total",
)


async def _evidence(cluster: BookieCluster) -> str:
    """What a failed heal check leaves for diagnosis: the marks still present, each bookie's
    autorecovery counters, and where its log was copied to (kept after the run)."""
    meta = await cluster.metadata()
    lines = []
    locked = await meta.underreplication.locked()
    marks = [record async for record in meta.underreplication.list()]
    lines.append(f"under-replication marks left: {len(marks)}")
    for record in marks[:50]:
        lines.append(
            f"  ledger {record.ledger_id}: missing {list(record.missing_bookies)} incomplete "
            f"{list(record.incomplete_bookies)} forced {list(record.forced_bookies)} "
            f"locked {record.ledger_id in locked}"
        )
    default = f"/tmp/bkaio-soak-{SEED}-{time.strftime('%Y%m%dT%H%M%S')}"
    keep = Path(os.environ.get("BKAIO_SOAK_EVIDENCE", default))
    kept = await asyncio.to_thread(_keep_logs, keep, [b.log_path for b in cluster.bookies])
    for bookie, copied in zip(cluster.bookies, kept, strict=True):
        counters: dict[str, object]
        try:
            sample = await bookie_metrics(bookie.admin_url)
            counters = {name: metric_sum(sample, name) for name in _EVIDENCE_METRICS}
        except OSError as error:
            counters = {"metrics": f"unavailable: {error!r}"}
        lines.append(f"  {bookie.bookie_id}: log {bookie.log_path} (kept as {copied}); {counters}")
    return "\n".join(lines)


def _keep_logs(keep: Path, logs: list[Path]) -> list[Path]:
    keep.mkdir(parents=True, exist_ok=True)
    kept = []
    for index, log_path in enumerate(logs):
        copied = keep / f"bookie-{index}.log"
        if log_path.exists():
            shutil.copyfile(log_path, copied)
        kept.append(copied)
    return kept


# The log events at which a bookie counts `bkaio_task_failures_total` (bkaio.supervision).
_TASK_FAILURE_EVENTS = frozenset(
    {"task_failed", "task_failure_hook_failed", "event_loop_exception"}
)


@dataclass
class LoggedTotals:
    """What the bookies did over the whole soak, from their logs: a bookie's counters start
    again at 0 in each process, and most bookies were restarted after their repairs, so the
    counters of the processes alive at the end miss most of it (one run read 0 ledgers out of
    limbo against 3,426 logged). Each log file is appended to by every run of its bookie."""

    ledgers_out_of_limbo: int = 0
    entries_out_of_limbo: int = 0
    entries_replicated: int = 0
    task_failures: int = 0


def _logged_totals(logs: list[Path]) -> LoggedTotals:
    totals = LoggedTotals()
    for log_path in logs:
        with log_path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if not line.startswith("{"):
                    continue  # Not structlog's (gRPC, a traceback's continuation).
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # Cut short by a kill -9.
                event = record.get("event")
                if event == "limbo_ledger_repaired":
                    totals.ledgers_out_of_limbo += 1
                    totals.entries_out_of_limbo += int(record.get("entries", 0))
                elif event == "ledger_replicated":
                    totals.entries_replicated += int(record.get("entries", 0))
                elif event in _TASK_FAILURE_EVENTS:
                    totals.task_failures += 1
    return totals


async def _limbo_ledgers(bookie: BookieProcess) -> float:
    """How many ledgers the bookie holds in limbo (its metrics; OSError if it does not answer)."""
    return metric_sum(await bookie_metrics(bookie.admin_url), "bkaio_bookie_limbo_ledgers")


async def _seal_all(uri: str, ledgers: list[int], deadline: float) -> dict[int, int]:
    """Recover (seal) every ledger, retrying the ones that cannot be decided yet."""
    sealed: dict[int, int] = {}
    async with BookKeeper.connect(uri, read_timeout=10.0) as bk:
        while len(sealed) < len(ledgers):
            for ledger_id in ledgers:
                if ledger_id in sealed:
                    continue
                try:
                    handle = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=True)
                except BKError as error:
                    assert time.monotonic() < deadline, f"BKAIO_SEED={SEED}: {ledger_id}: {error}"
                    continue
                sealed[ledger_id] = handle.last_entry_id
            if len(sealed) < len(ledgers):
                await asyncio.sleep(2.0)
    return sealed


@pytest.mark.soak
@pytest.mark.timeout(int(MINUTES * 60 + SETTLE_SECONDS + 900))
async def test_autorecovery_soak_loses_nothing_and_heals(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    print(f"\nBKAIO_SEED={SEED} BKAIO_SOAK_MINUTES={MINUTES}")
    rng = random.Random(SEED)
    cluster = await bookie_cluster_factory(
        count=BOOKIES, metadata_uri=etcd_server.uri, config=CONFIG
    )
    uri = etcd_server.uri
    written = Written()
    stop = asyncio.Event()
    writers = [
        asyncio.ensure_future(_writer(n, uri, written, stop, random.Random(rng.random())))
        for n in range(2)
    ]
    nemesis = Nemesis(cluster, random.Random(rng.random()))
    deadline = time.monotonic() + MINUTES * 60
    while time.monotonic() < deadline:
        await asyncio.sleep(rng.uniform(3.0, 15.0))
        await nemesis.step()
        for writer in writers:
            if writer.done():
                writer.result()  # A writer must never die of an unexpected error.
    stop.set()
    await asyncio.gather(*writers)
    await nemesis.stop()
    print(f"faults: {dict(nemesis.actions)}; writer failures: {dict(written.failures)}")

    settle_deadline = time.monotonic() + SETTLE_SECONDS
    sealed = await _seal_all(uri, sorted(written.acked), settle_deadline)
    meta = await cluster.metadata()
    view = ClusterView(meta)
    await view.start()
    try:
        checker = LedgerChecker(view, AutorecoveryMetrics())
        while (why := await _healed(cluster, checker)) is not None:
            if time.monotonic() >= settle_deadline:
                evidence = await _evidence(cluster)
                print(f"soak not healed: {why}\n{evidence}")
                raise AssertionError(f"BKAIO_SEED={SEED}: not healed: {why}\n{evidence}")
            await asyncio.sleep(2.0)
    finally:
        await view.close()

    entries = copies = 0
    async with BookKeeper.connect(uri, read_timeout=10.0) as bk:
        for ledger_id, acked in sorted(written.acked.items()):
            handle = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            last = handle.last_entry_id
            assert last == sealed[ledger_id]
            if acked:
                assert last >= max(acked), f"BKAIO_SEED={SEED}: {ledger_id} sealed at {last}"
            payloads = [e.payload for e in await handle.read(0, last)] if last >= 0 else []
            for entry_id, payload in acked.items():
                assert payloads[entry_id] == payload, f"BKAIO_SEED={SEED}: {ledger_id}/{entry_id}"
            entries += len(acked)
            md = await meta.ledgers.get(ledger_id)
            if payloads:
                copies += await verify_full_replication(cluster, md, payloads)
    logged = await asyncio.to_thread(_logged_totals, [b.log_path for b in cluster.bookies])
    print(
        f"soak: {len(written.acked)} ledgers, {entries} acknowledged entries all read back, "
        f"{copies} copies checked; {logged.entries_replicated} entries re-replicated, "
        f"{logged.ledgers_out_of_limbo} ledgers ({logged.entries_out_of_limbo} entries) copied "
        f"back out of limbo; supervised task failures {logged.task_failures}"
    )
    assert logged.task_failures == 0, f"BKAIO_SEED={SEED}: supervised tasks failed"
