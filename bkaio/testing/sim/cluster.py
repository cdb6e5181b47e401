"""One simulated cluster: bookies, clients, the network, the metadata store and the history.

`SimCluster` is built inside a running `SimLoop` (bkaio.testing.sim.loop) from `SimOptions`
(what one seed decided: sizes, quorums, network and disk models, mutations). Workloads run as
client processes and record every operation in `history` (bkaio.testing.history); the final
phase (`finish`) heals the network, repairs disks, restarts every bookie that is down, then a
fresh client recovers each ledger and reads it back in full, so that the checker can judge the
whole run (bkaio.testing.checker).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bkaio.errors import BKError
from bkaio.journal.writer import ACK_AFTER_SYNC, JournalAckPolicy
from bkaio.ledger_client.recovery import FENCED_RECOVERY_READS, RecoveryReadPolicy
from bkaio.meta.bookies import BookieInfo
from bkaio.testing.history import History
from bkaio.testing.sim.disk import DiskModel
from bkaio.testing.sim.meta import LostAnswer, MemoryMetadataServer
from bkaio.testing.sim.network import NetworkModel, SimNetwork
from bkaio.testing.sim.nodes import Environment, SimBookie, SimClient

PASSWORD = b"sim"
START_TIMEOUT_SECONDS = 30.0
FINAL_TIMEOUT_SECONDS = 120.0
FINAL_ATTEMPTS = 5
FINAL_RETRY_SECONDS = 1.0


@dataclass
class SimOptions:
    bookies: int = 3
    quorum: tuple[int, int, int] = (3, 3, 2)  # Ensemble, write quorum, ack quorum.
    network: NetworkModel = field(default_factory=NetworkModel)
    disk: DiskModel = field(default_factory=DiskModel)
    lost_metadata_answers: float = 0.0  # Chance that a conditional write's answer is lost,
    lost_metadata_kinds: tuple[LostAnswer, ...] = tuple(LostAnswer)  # and how (drawn evenly).
    journal_ack: JournalAckPolicy = ACK_AFTER_SYNC  # A mutation check passes a broken one.
    recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS  # Likewise.
    add_timeout: float = 1.0
    read_timeout: float = 1.0


class SimCluster:
    def __init__(self, rng: random.Random, root: Path, options: SimOptions) -> None:
        loop = asyncio.get_running_loop()
        self.rng = rng
        self.root = root
        self.options = options
        self.loop = loop
        network = SimNetwork(loop, random.Random(rng.random()), options.network)
        loop.network = network  # type: ignore[attr-defined]
        self.network = network
        self.env = Environment(
            loop,
            network,
            MemoryMetadataServer(),
            random.Random(rng.random()),
            lost_metadata_answers=options.lost_metadata_answers,
            lost_metadata_kinds=options.lost_metadata_kinds,
        )
        self.history = History(clock=loop.time)
        self.bookies = [
            SimBookie(
                self.env,
                index,
                root / f"b{index}",
                DiskModel(**vars(options.disk)),
                journal_ack=options.journal_ack,
            )
            for index in range(options.bookies)
        ]
        self.address_book: dict[str, BookieInfo] = {b.bookie_id: b.info for b in self.bookies}
        self.clients: dict[str, SimClient] = {}
        self.ledgers: list[int] = []
        self.notes = self.env.notes  # What the nemesis did (and who exited), for the report.

    # ----------------------------------------------------------------- processes

    def bookie(self, bookie_id: str) -> SimBookie:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def client(self, name: str, **options: Any) -> SimClient:
        client = SimClient(
            self.env,
            name,
            self.address_book,
            recovery_reads=self.options.recovery_reads,
            add_timeout=options.pop("add_timeout", self.options.add_timeout),
            read_timeout=options.pop("read_timeout", self.options.read_timeout),
        )
        assert not options, options
        client.start()
        self.clients[name] = client
        return client

    def note(self, text: str) -> None:
        self.env.note(text)

    async def start(self) -> None:
        """Start every bookie and wait until each is registered (one that fails to start
        exits and is started again)."""
        for bookie in self.bookies:
            bookie.start()
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            for bookie in self.bookies:
                # Polled: a failed start replaces the bookie's events with new ones.
                while not bookie.registered.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.05)

    async def wait_registered(self, count: int) -> None:
        watcher = self.env.metadata_connection()
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            async for bookies in watcher.bookies.watch():
                if len(bookies) >= count:
                    return

    def crash_bookie(self, bookie: SimBookie, *, power_loss: bool) -> None:
        if bookie.alive:
            self.note(f"crash {bookie.name} power_loss={power_loss}")
            bookie.crash(power_loss=power_loss)

    def crash_client(self, client: SimClient) -> None:
        if client.alive:
            self.note(f"crash {client.name}")
            client.crash()

    def isolate(self, bookie: SimBookie) -> None:
        """Cut `bookie` off from every client (its connections hold until it heals)."""
        self.note(f"isolate {bookie.name}")
        self.network.isolate(bookie.name, list(self.clients))

    def restart_bookie(self, bookie: SimBookie) -> None:
        if not bookie.alive:
            self.note(f"restart {bookie.name}")
            bookie.start()

    # ----------------------------------------------------------------- the end

    async def finish(self) -> str | None:
        """Heal, restart, recover and read every ledger; a liveness problem or None."""
        self.note("final phase")
        self.network.heal()
        for bookie in self.bookies:
            bookie.disk.repair()
            bookie.disarm_crash_point()
            if not bookie.alive:
                self.restart_bookie(bookie)
        for bookie in self.bookies:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(START_TIMEOUT_SECONDS):
                    await bookie.serving.wait()
        down = [b.name for b in self.bookies if not b.serving.is_set()]
        if down:
            failures = [
                f"{b.name}: {b.start_failures[-1:]}" for b in self.bookies if b.name in down
            ]
            return f"bookies never came back: {failures}"
        try:
            await self.wait_registered(len(self.bookies))
        except TimeoutError:
            return "bookies never registered again"
        client = self.client("final", add_timeout=2.0, read_timeout=2.0)
        task = client.spawn(self._final_reads(client), "final")
        try:
            async with asyncio.timeout(FINAL_TIMEOUT_SECONDS):
                return await task
        except TimeoutError:
            return "final phase timed out"

    async def _final_reads(self, client: SimClient) -> str | None:
        bk = await client.connect()
        for ledger_id in self.ledgers:
            handle = None
            failure = ""
            for _attempt in range(FINAL_ATTEMPTS):  # Recovery may fail and be retried.
                inv = self.history.invoke("final", "seal", ledger_id)
                try:
                    handle = await bk.open_ledger(ledger_id, PASSWORD, recovery=True)
                except BKError as error:
                    self.history.failed(inv, error)
                    failure = f"final recovery of ledger {ledger_id} failed: {error!r}"
                    await asyncio.sleep(FINAL_RETRY_SECONDS)
                    continue
                self.history.ok(inv, value=handle.last_entry_id)
                break
            if handle is None:
                return failure
            last = handle.last_entry_id
            invs = [
                self.history.invoke("final", "read", ledger_id, entry=e, extra={"final": True})
                for e in range(last + 1)
            ]
            try:
                entries = await handle.read(0, last) if last >= 0 else []
            except BKError as error:
                for one in invs:
                    self.history.failed(one, error)
                return f"final read of ledger {ledger_id} failed: {error!r}"
            for one, entry in zip(invs, entries, strict=True):
                self.history.ok(one, value=entry.payload.decode())
        return None

    def stop_clients(self) -> None:
        """Every application process ends (killed: what it had in flight stays unknown)."""
        for client in self.clients.values():
            client.crash()

    def stop_everything(self) -> None:
        """Kill every process (the simulation is over): descriptors and indexes are closed."""
        for client in self.clients.values():
            client.crash()
        for bookie in self.bookies:
            if bookie.alive:
                bookie.crash(power_loss=False)
