"""Simulated bookies, network and metadata for the real ledger client (bkaio.ledger_client).

The client runs unmodified: `SimBookieOps` implements its `BookieOps` seam and `SimLedgerStore`
its `LedgerStore`. What is simulated is the protocol level:
- `SimBookie`: one bookie's ledger state with the storage rules of docs/internal-apis.md
  (master key on first sight, fencing durable and applied even to unknown ledgers, RECOVERY_ADD
  allowed when fenced, identical re-adds fine and different ones refused, LAC = max of the
  piggybacked and explicit LACs). Everything it accepted is durable (it answers after "fsync").
- `SimNetwork`: per (client, bookie) link, seeded latency, random loss (the caller times out),
  slow messages, bookies that are down (connection refused), and scripted rules that hold, drop
  or delay one kind of request (the F8 schedule).
- `SimLedgerStore`: CAS on a version, small random latency, optionally "unknown outcome" on
  updates (applied, then the reply is lost), as with etcd during a leader change.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from bkaio.errors import (
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    EntryConflictError,
    LedgerFencedError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.ledger_client.types import AddCallback, EntriesAnswer, LacAnswer, StoredCopy
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.records import pack_record

T = TypeVar("T")
Kind = Literal["add", "read", "read_lac", "write_lac"]


@dataclass
class _Ledger:
    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    entries: dict[int, StoredCopy] = field(default_factory=dict)

    @property
    def lac(self) -> int:
        return max(max((c.lac for c in self.entries.values()), default=-1), self.explicit_lac)


class SimBookie:
    def __init__(self, bookie_id: str) -> None:
        self.bookie_id = bookie_id
        self.ledgers: dict[int, _Ledger] = {}

    def _keyed(self, ledger_id: int, master_key: bytes) -> _Ledger:
        ledger = self.ledgers.setdefault(ledger_id, _Ledger(master_key))
        if ledger.master_key != master_key:
            raise UnauthorizedError(f"{self.bookie_id}: wrong master key for ledger {ledger_id}")
        return ledger

    def add(self, ledger_id: int, copy: StoredCopy, master_key: bytes, recovery: bool) -> None:
        ledger = self._keyed(ledger_id, master_key)
        if ledger.fenced and not recovery:
            raise LedgerFencedError(f"{self.bookie_id}: ledger {ledger_id} is fenced")
        existing = ledger.entries.get(copy.entry_id)
        if existing is not None and existing.payload != copy.payload:
            raise EntryConflictError(f"{self.bookie_id}: entry {copy.entry_id} differs")
        ledger.entries[copy.entry_id] = copy

    def _fence(self, ledger_id: int, master_key: bytes | None) -> None:
        assert master_key is not None, "a fencing request carries the master key"
        self._keyed(ledger_id, master_key).fenced = True

    def read(self, ledger_id: int, entry_id: int, fence: bool, key: bytes | None) -> StoredCopy:
        if fence:
            self._fence(ledger_id, key)
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(f"{self.bookie_id}: no ledger {ledger_id}")
        if entry_id == -1:
            entry_id = max(ledger.entries, default=-1)
        found = ledger.entries.get(entry_id)
        if found is None:
            raise NoSuchEntryError(f"{self.bookie_id}: ledger {ledger_id} has no entry {entry_id}")
        return found

    def read_entries(
        self, ledger_id: int, first: int, last: int, stride: int, max_count: int
    ) -> EntriesAnswer:
        """The wanted entries held, as records (no byte limit, no long poll)."""
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(f"{self.bookie_id}: no ledger {ledger_id}")
        parts: list[bytes] = []
        next_id = first
        count = 0
        while next_id <= last and count < max_count:
            copy = ledger.entries.get(next_id)
            if copy is not None:
                parts += pack_record(
                    ledger_id, next_id, copy.lac, copy.length, copy.digest, copy.payload
                )
                count += 1
            next_id += stride
        return EntriesAnswer(ledger.lac, next_id, b"".join(parts))

    def read_lac(self, ledger_id: int, fence: bool, key: bytes | None) -> LacAnswer:
        if fence:
            self._fence(ledger_id, key)
        ledger = self.ledgers.get(ledger_id)
        if ledger is None:
            raise NoSuchLedgerError(f"{self.bookie_id}: no ledger {ledger_id}")
        return LacAnswer(ledger.lac, max(ledger.entries, default=-1))

    def write_lac(self, ledger_id: int, master_key: bytes, lac: int) -> None:
        ledger = self._keyed(ledger_id, master_key)
        ledger.explicit_lac = max(ledger.explicit_lac, lac)


@dataclass
class SimRule:
    """A scripted fault on one link: hold (until `SimNetwork.release`), drop, or delay."""

    client: str
    bookie_id: str
    kind: Kind
    action: Literal["hold", "drop", "delay"] = "hold"
    fence_only: bool = False
    delay: float = 0.0


@dataclass
class SimFaults:
    latency: tuple[float, float] = (0.0001, 0.002)
    loss: float = 0.0  # Chance that a request or its answer is lost.
    slow: float = 0.0  # Chance of a long delay.
    slow_latency: tuple[float, float] = (0.05, 0.6)


class SimNetwork:
    def __init__(self, rng: random.Random, bookies: list[SimBookie], faults: SimFaults) -> None:
        self.rng = rng
        self.bookies = {b.bookie_id: b for b in bookies}
        self.faults = faults
        self.down: set[str] = set()
        self.rules: list[SimRule] = []
        self._held: dict[tuple[str, str], list[asyncio.Future[None]]] = {}
        self.messages = 0

    def heal(self) -> None:
        self.faults = SimFaults()
        self.down.clear()
        self.rules.clear()
        for key in list(self._held):
            self.release(*key)

    def release(self, client: str, bookie_id: str) -> None:
        for gate in self._held.pop((client, bookie_id), []):
            if not gate.done():
                gate.set_result(None)

    def latency(self) -> float:
        faults = self.faults
        if faults.slow and self.rng.random() < faults.slow:
            return self.rng.uniform(*faults.slow_latency)
        return self.rng.uniform(*faults.latency)

    def rule(self, client: str, bookie_id: str, kind: Kind, fence: bool) -> SimRule | None:
        for rule in self.rules:
            if (rule.client, rule.bookie_id, rule.kind) == (client, bookie_id, kind) and (
                fence or not rule.fence_only
            ):
                return rule
        return None

    def hold_gate(self, client: str, bookie_id: str) -> asyncio.Future[None]:
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.setdefault((client, bookie_id), []).append(gate)
        return gate


class SimBookieOps:
    """`BookieOps` for one client over the simulated network."""

    def __init__(
        self, network: SimNetwork, client: str, *, add_timeout: float, read_timeout: float
    ) -> None:
        self.network = network
        self.client = client
        self.add_timeout = add_timeout
        self.read_timeout = read_timeout
        self._tasks: set[asyncio.Task[None]] = set()

    async def _exchange(
        self,
        bookie_id: str,
        kind: Kind,
        fence: bool,
        limit_seconds: float,
        apply: Callable[[SimBookie], T],
    ) -> T:
        net = self.network
        net.messages += 1
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def lost() -> T:
            await asyncio.sleep(max(0.0, started + limit_seconds - loop.time()))
            raise BKTimeoutError(f"{self.client} -> {bookie_id}: {kind} timed out (simulated)")

        if bookie_id in net.down:
            await asyncio.sleep(net.latency())
            raise BookieUnavailableError(f"{bookie_id} is down (simulated)")
        rule = net.rule(self.client, bookie_id, kind, fence)
        if rule is not None and rule.action == "drop":
            return await lost()
        if net.faults.loss and net.rng.random() < net.faults.loss:
            return await lost()
        await asyncio.sleep(net.latency())
        if rule is not None and rule.action == "delay":
            await asyncio.sleep(rule.delay)
        if rule is not None and rule.action == "hold":
            await net.hold_gate(self.client, bookie_id)
        if bookie_id in net.down:
            return await lost()  # Crashed with the request in flight.
        error: BKError | None = None
        result: T | None = None
        try:
            result = apply(net.bookies[bookie_id])
        except BKError as caught:
            error = caught
        if net.faults.loss and net.rng.random() < net.faults.loss:
            return await lost()  # The answer is lost.
        await asyncio.sleep(net.latency())
        if loop.time() - started > limit_seconds:
            raise BKTimeoutError(f"{self.client} -> {bookie_id}: {kind} answered too late")
        if error is not None:
            raise error
        return result  # type: ignore[return-value]

    def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        callback: AddCallback,
    ) -> None:
        copy = StoredCopy(entry_id, lac, length, digest, payload)

        async def run() -> None:
            try:
                await self._exchange(
                    bookie_id,
                    "add",
                    False,
                    self.add_timeout,
                    lambda b: b.add(ledger_id, copy, master_key, recovery),
                )
            except BKError as error:
                callback(error)
            else:
                callback(None)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        return await self._exchange(
            bookie_id,
            "read",
            fence,
            self.read_timeout,
            lambda b: b.read(ledger_id, entry_id, fence, master_key),
        )

    async def read_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        stride: int = 1,
        max_count: int,
        max_bytes: int,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> EntriesAnswer:
        del max_bytes, previous_lac, long_poll_seconds  # No byte limit; long polls answer at once.
        return await self._exchange(
            bookie_id,
            "read",
            False,
            self.read_timeout,
            lambda b: b.read_entries(ledger_id, first_entry_id, last_entry_id, stride, max_count),
        )

    async def read_lac(
        self,
        bookie_id: str,
        ledger_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> LacAnswer:
        del previous_lac, long_poll_seconds  # Long polls answer at once here.
        return await self._exchange(
            bookie_id,
            "read_lac",
            fence,
            self.read_timeout,
            lambda b: b.read_lac(ledger_id, fence, master_key),
        )

    async def write_lac(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        await self._exchange(
            bookie_id,
            "write_lac",
            False,
            self.add_timeout,
            lambda b: b.write_lac(ledger_id, master_key, lac),
        )

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class SimLedgerStore:
    """Ledger metadata with CAS, latency, and (optionally) lost replies to updates."""

    def __init__(self, rng: random.Random, *, unknown_outcome: float = 0.0) -> None:
        self.rng = rng
        self.unknown_outcome = unknown_outcome
        self.records: dict[int, LedgerMetadata] = {}
        self.history: list[LedgerMetadata] = []  # Every stored version, in order.
        self._versions = itertools.count(1)
        self._ids = itertools.count(1)

    async def _latency(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.0005, 0.005))

    async def next_id(self) -> int:
        await self._latency()
        return next(self._ids)

    async def create(self, metadata: LedgerMetadata) -> LedgerMetadata:
        await self._latency()
        stored = metadata.with_version(next(self._versions))
        self.records[stored.ledger_id] = stored
        self.history.append(stored)
        return stored

    async def get(self, ledger_id: int) -> LedgerMetadata:
        await self._latency()
        if ledger_id not in self.records:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")
        return self.records[ledger_id]

    async def update(self, metadata: LedgerMetadata) -> LedgerMetadata:
        await self._latency()
        current = self.records.get(metadata.ledger_id)
        if current is None:
            raise NoSuchLedgerError(f"ledger {metadata.ledger_id} was deleted")
        if current.version != metadata.version:
            raise MetadataVersionError(
                f"ledger {metadata.ledger_id}: version {metadata.version} != {current.version}"
            )
        stored = metadata.with_version(next(self._versions))
        self.records[metadata.ledger_id] = stored
        self.history.append(stored)
        if self.unknown_outcome and self.rng.random() < self.unknown_outcome:
            await self._latency()
            raise MetadataOutcomeUnknownError("reply lost after the update applied (simulated)")
        return stored

    async def delete(self, ledger_id: int) -> None:
        await self._latency()
        if self.records.pop(ledger_id, None) is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} has no metadata")

    async def list_ids(self) -> AsyncIterator[int]:
        for ledger_id in sorted(self.records):
            yield ledger_id
