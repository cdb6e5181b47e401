"""Which fragments of a ledger a set of bookies holds, and the metadata after moving one. Pure.

A *fragment* is what one bookie stores of one segment: the entries of the segment whose write
set includes that bookie's ensemble index (BookKeeper's LedgerFragment). Segment s covers
[first_entry_id, next segment's first - 1]; the last segment ends at last_entry_id once the
ledger is CLOSED and is open-ended (the *open tail*) while the writer may still append.
No I/O: the replicator and the auditor feed these functions the metadata they read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from bkaio.errors import BKError
from bkaio.meta.ledger_metadata import LedgerMetadata


class ReplicationError(BKError):
    """A ledger could not be re-replicated now (no copy readable, no replacement, ...).

    The one error `Replicator.replicate_ledger` raises: whatever failed underneath (a read, a
    replacement bookie, the metadata, the recovery of an open ledger) is named in the message
    and chained as the cause; `ledger_id` says which ledger.
    """

    retriable = True

    def __init__(self, message: str, *, ledger_id: int | None = None) -> None:
        super().__init__(message)
        self.ledger_id = ledger_id


class LockLeaseUnconfirmedError(ReplicationError):
    """The lease of the ledger's under-replication lock is lost, or was in doubt (no refresh
    confirmed within its TTL by this process's clock, as after a stalled event loop) and not
    confirmed again in time: the store may have dropped the lock and another worker (or a
    bookie's GC) taken the ledger, so the step that needed the lock was not taken. Not the
    ledger's fault: its holder gives the lock back (if still its own) and claims again under a
    sound lease."""


class EntryUnreadableError(ReplicationError):
    """No surviving bookie of the entry's write set returned a digest-valid copy of it: each
    one asked answered that it has none or a copy with a bad digest, or is not registered
    (dead), or none is left to ask.

    Retrying soon rarely helps (it helps when a bookie holding a copy comes back), so an
    admin `recover` reports the ledger at once and goes on with the others."""

    def __init__(self, message: str, *, ledger_id: int, entry_id: int) -> None:
        super().__init__(message, ledger_id=ledger_id)
        self.entry_id = entry_id


class EntrySourcesUnavailableError(ReplicationError):
    """No copy of an entry could be read now, but a registered bookie that may hold one did not
    answer (timed out, busy, restarting, in limbo): transient, unlike `EntryUnreadableError`;
    retried (by a drain until its timeout, by the workers always)."""

    def __init__(self, message: str, *, ledger_id: int, entry_id: int) -> None:
        super().__init__(message, ledger_id=ledger_id)
        self.entry_id = entry_id


@dataclass(frozen=True, slots=True)
class Fragment:
    ledger_id: int
    first_entry_id: int  # First entry of the segment (the segment's key in the metadata).
    last_entry_id: int  # Last entry of the segment; first - 1 when it holds none.
    ensemble: tuple[str, ...]
    bookie_index: int  # Ensemble index of the bookie this fragment is about.
    open_tail: bool  # The last segment of a ledger that is not CLOSED: its end is unknown.

    @property
    def bookie_id(self) -> str:
        return self.ensemble[self.bookie_index]


def holds_entry(bookie_index: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble index `bookie_index` is in the write set of `entry_id`."""
    assert 0 <= bookie_index < ensemble_size and 0 < write_quorum <= ensemble_size
    return (bookie_index - entry_id) % ensemble_size < write_quorum


def fragment_entries(fragment: Fragment, ensemble_size: int, write_quorum: int) -> Iterator[int]:
    """The entry ids of `fragment` its bookie stores, ascending (none for an open tail)."""
    if fragment.open_tail:
        return
    first = fragment.first_entry_id
    # The bookie's entries recur with period E: Qw consecutive ids out of every E.
    for entry_id in range(first, fragment.last_entry_id + 1):
        if holds_entry(fragment.bookie_index, entry_id, ensemble_size, write_quorum):
            yield entry_id


def fragments_on(metadata: LedgerMetadata, bookie_ids: Collection[str]) -> list[Fragment]:
    """Every fragment of the ledger held by one of `bookie_ids`, in segment order."""
    fragments: list[Fragment] = []
    segments = metadata.ensembles
    for position, (first_entry_id, ensemble) in enumerate(segments):
        last_segment = position == len(segments) - 1
        open_tail = last_segment and not metadata.is_closed
        if last_segment:
            last_entry_id = metadata.last_entry_id if metadata.is_closed else first_entry_id - 1
            # A closed ledger's last segment may start after its last entry (an empty segment).
            last_entry_id = max(last_entry_id, first_entry_id - 1)
        else:
            last_entry_id = segments[position + 1][0] - 1
        for index, bookie_id in enumerate(ensemble):
            if bookie_id in bookie_ids:
                fragments.append(
                    Fragment(
                        metadata.ledger_id,
                        first_entry_id,
                        last_entry_id,
                        tuple(ensemble),
                        index,
                        open_tail,
                    )
                )
    return fragments


def bookies_of(metadata: LedgerMetadata) -> set[str]:
    """Every bookie named in any segment of the ledger."""
    return {bookie_id for _, ensemble in metadata.ensembles for bookie_id in ensemble}


def replace_in_segment(
    metadata: LedgerMetadata, first_entry_id: int, bookie_index: int, old: str, new: str
) -> LedgerMetadata | None:
    """The metadata with `old` replaced by `new` at `bookie_index` of the segment starting at
    `first_entry_id`; None if that slot no longer holds `old` (someone moved it already)."""
    segments = list(metadata.ensembles)
    for position, (first, ensemble) in enumerate(segments):
        if first != first_entry_id:
            continue
        if ensemble[bookie_index] != old:
            return None
        if new in ensemble:
            raise ReplicationError(
                f"ledger {metadata.ledger_id}: {new} is already in the segment at entry"
                f" {first_entry_id} ({list(ensemble)}); it cannot replace {old}"
            )
        replaced = list(ensemble)
        replaced[bookie_index] = new
        segments[position] = (first, tuple(replaced))
        return metadata.replace(ensembles=tuple(segments))
    return None
