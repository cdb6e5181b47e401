"""Deliberately broken parts: the fault suite's mutation checks run the system with one of them
to prove that their checker notices (a suite that passes with a broken bookie proves nothing).

- `AckBeforeSync` (journal, `--mutation ack_before_fsync` of bkaio.testing.bookie): each group is
  acknowledged once written, and synced only when the next group comes. With a lazy disk, a
  kill -9 then loses acknowledged entries; tests/faults F3's mutation check must see that.
- `UnfencedRecoveryReads` (client, `BookKeeper(..., recovery_reads=UNFENCED_RECOVERY_READS)`):
  recovery reads lose their FENCE flag (BookKeeper issue 2614); F8's mutation check, in the real
  fault suite and in the simulator, must see the lost acknowledged write.
- `LimboTrustingRecoveryReads` (client, `recovery_reads=LIMBO_TRUSTING_RECOVERY_READS`): recovery
  takes a reformatted bookie's DATA_UNKNOWN (its ledger in limbo) for "no such entry", as if it
  were true testimony; F28's mutation check must see the ledger sealed short.

Never used outside tests: nothing in production imports this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from bkaio.errors import BKError, ConfigError, DataUnknownError, NoSuchEntryError
from bkaio.journal.writer import Group, JournalFileWriter
from bkaio.ledger_client.types import (
    AddCallback,
    AddFrame,
    BookieOps,
    EntriesAnswer,
    LacAnswer,
    StoredCopy,
)

_Add = TypeVar("_Add")


class AckBeforeSync:
    """BROKEN on purpose: a group is acknowledged before its fdatasync (the previous group's
    sync happens first, so exactly the last acknowledged group is unsynced at any time)."""

    def commit(self, writer: JournalFileWriter, group: Group) -> float:
        writer.sync_current()  # The previous group, already acknowledged.
        writer.write_group(group)
        return 0.0


class _PassThroughOps:
    """A client's bookie operations, passed on unchanged (the mutations below override one)."""

    def __init__(self, ops: BookieOps) -> None:
        self._ops = ops

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
        self._ops.add_entry(
            bookie_id,
            ledger_id,
            entry_id,
            recovery=recovery,
            master_key=master_key,
            lac=lac,
            length=length,
            digest=digest,
            payload=payload,
            callback=callback,
        )

    def add_entry_many(
        self,
        targets: Sequence[tuple[str, Callable[[_Add, BKError | None], None]]],
        add: _Add,
        ledger_id: int,
        entry_id: int,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
    ) -> None:
        self._ops.add_entry_many(
            targets, add, ledger_id, entry_id, recovery, master_key, lac, length, digest, payload
        )

    def add_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        recovery: bool,
        master_key: bytes,
        handler: Callable[[_Add, BKError | None], None],
        adds: Sequence[_Add],
        frames: Sequence[AddFrame],
    ) -> bool:
        return self._ops.add_entries(
            bookie_id, ledger_id, recovery, master_key, handler, adds, frames
        )

    def when_writable(self, bookie_id: str, ledger_id: int, callback: Callable[[], None]) -> bool:
        return self._ops.when_writable(bookie_id, ledger_id, callback)

    def defer_send(self, send: Callable[[], None]) -> None:
        self._ops.defer_send(send)

    async def close(self) -> None:
        await self._ops.close()

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        return await self._ops.read_entry(
            bookie_id, ledger_id, entry_id, fence=fence, master_key=master_key
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
        return await self._ops.read_entries(
            bookie_id,
            ledger_id,
            first_entry_id,
            last_entry_id,
            stride=stride,
            max_count=max_count,
            max_bytes=max_bytes,
            previous_lac=previous_lac,
            long_poll_seconds=long_poll_seconds,
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
        return await self._ops.read_lac(
            bookie_id,
            ledger_id,
            fence=fence,
            master_key=master_key,
            previous_lac=previous_lac,
            long_poll_seconds=long_poll_seconds,
        )

    async def write_lac(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        await self._ops.write_lac(bookie_id, ledger_id, master_key, lac)


class UnfencedReads(_PassThroughOps):
    """A client's bookie operations with the FENCE flag taken off every entry read."""

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        del fence  # The mutation.
        return await self._ops.read_entry(
            bookie_id, ledger_id, entry_id, fence=False, master_key=master_key
        )


class LimboTrustingReads(_PassThroughOps):
    """A client's bookie operations that take DATA_UNKNOWN (a bookie in limbo) for NO_SUCH_ENTRY."""

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        try:
            return await self._ops.read_entry(
                bookie_id, ledger_id, entry_id, fence=fence, master_key=master_key
            )
        except DataUnknownError as unknown:  # The mutation: believe the amnesiac witness.
            raise NoSuchEntryError(f"{bookie_id}: entry {entry_id}: {unknown}") from unknown


class LimboTrustingRecoveryReads:
    """BROKEN on purpose: a `RecoveryReadPolicy` whose recovery counts a bookie in limbo's
    DATA_UNKNOWN as a "no" towards an entry's absence."""

    def reader_ops(self, ops: BookieOps) -> BookieOps:
        return LimboTrustingReads(ops)


LIMBO_TRUSTING_RECOVERY_READS: Final = LimboTrustingRecoveryReads()


class UnfencedRecoveryReads:
    """BROKEN on purpose: a `RecoveryReadPolicy` whose recovery reads do not fence."""

    def reader_ops(self, ops: BookieOps) -> BookieOps:
        return UnfencedReads(ops)


UNFENCED_RECOVERY_READS: Final = UnfencedRecoveryReads()

# The bookie-side mutations by the name `--mutation` takes.
JOURNAL_MUTATIONS: Final = {"ack_before_fsync": AckBeforeSync}


def journal_mutation(name: str) -> AckBeforeSync:
    """The journal ack policy of bookie mutation `name`."""
    try:
        return JOURNAL_MUTATIONS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown bookie mutation {name!r}; known: {', '.join(sorted(JOURNAL_MUTATIONS))}"
        ) from None
