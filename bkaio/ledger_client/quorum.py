"""Quorum arithmetic of the ledger client: striping, segments and coverage (pure, no I/O).

After BookKeeper's `RoundRobinDistributionSchedule`: entry e of a segment with ensemble size E
goes to the ensemble indexes (e + k) % E for k < Qw, using the absolute entry id. Everything
here is a function of its arguments; the handles in this package own the state.
Imports nothing from asyncio, sockets or the metadata store.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

# A segment of a ledger: (first entry id, bookie ids in ensemble order), as in LedgerMetadata.
Segment = tuple[int, tuple[str, ...]]


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble indexes of the bookies that store `entry_id` (round-robin striping)."""
    assert 0 < write_quorum <= ensemble_size, (write_quorum, ensemble_size)
    assert entry_id >= 0, entry_id
    return tuple((entry_id + k) % ensemble_size for k in range(write_quorum))


def write_sets(ensemble_size: int, write_quorum: int) -> list[tuple[int, ...]]:
    """The E distinct write sets of a segment (one starting at each ensemble index)."""
    return [write_set(start, ensemble_size, write_quorum) for start in range(ensemble_size)]


def negatives_for_absence(write_quorum: int, ack_quorum: int) -> int:
    """How many explicit "no such entry" answers of a write set prove an entry unacknowledged.

    An acknowledged entry is on at least Qa bookies of its write set, so at most Qw - Qa of
    them can truthfully say no; one more than that rules it out.
    """
    assert 0 < ack_quorum <= write_quorum, (ack_quorum, write_quorum)
    return write_quorum - ack_quorum + 1


def has_quorum_coverage(
    answered: Collection[int], ensemble_size: int, write_quorum: int, ack_quorum: int
) -> bool:
    """True when every write set has at least Qw - Qa + 1 answered ensemble indexes.

    Used for fencing (no ack quorum is left entirely unfenced) and for reading the LAC
    (the highest acknowledged entry was seen by at least one answering bookie).
    """
    needed = negatives_for_absence(write_quorum, ack_quorum)
    return all(
        sum(1 for index in indexes if index in answered) >= needed
        for indexes in write_sets(ensemble_size, write_quorum)
    )


def coverage_still_possible(
    failed: Collection[int], ensemble_size: int, write_quorum: int, ack_quorum: int
) -> bool:
    """False once some write set has too many failed indexes to ever reach coverage."""
    needed = negatives_for_absence(write_quorum, ack_quorum)
    return all(
        write_quorum - sum(1 for index in indexes if index in failed) >= needed
        for indexes in write_sets(ensemble_size, write_quorum)
    )


def segment_for_entry(ensembles: Sequence[Segment], entry_id: int) -> Segment:
    """The segment covering `entry_id`: the one with the greatest first entry id <= entry_id."""
    assert ensembles, "a ledger always has at least one segment"
    assert ensembles[0][0] == 0, ensembles
    chosen = ensembles[0]
    for segment in ensembles:
        if segment[0] > entry_id:
            break
        chosen = segment
    return chosen


def bookies_for_entry(
    ensembles: Sequence[Segment], entry_id: int, write_quorum: int
) -> tuple[str, ...]:
    """Bookie ids of the write set of `entry_id`, in write-set order (the read order)."""
    _, bookies = segment_for_entry(ensembles, entry_id)
    return tuple(bookies[index] for index in write_set(entry_id, len(bookies), write_quorum))


def with_new_segment(
    ensembles: Sequence[Segment], first_entry_id: int, bookies: Sequence[str]
) -> tuple[Segment, ...]:
    """Ensembles after a change that takes effect at `first_entry_id` (LAC + 1).

    A last segment that already starts there is replaced rather than followed by an empty
    one (BookKeeper: a failure on entry 0 leaves a single segment). A start before the last
    segment's start would rewrite committed history and is a programmer error.
    """
    assert ensembles, "a ledger always has at least one segment"
    last_start = ensembles[-1][0]
    assert first_entry_id >= last_start, (first_entry_id, last_start)
    assert len(bookies) == len(ensembles[-1][1]), (bookies, ensembles[-1])
    new_segment: Segment = (first_entry_id, tuple(bookies))
    if first_entry_id == last_start:
        return (*ensembles[:-1], new_segment)
    return (*ensembles, new_segment)


def replaced_indexes(old: Sequence[str], new: Sequence[str]) -> list[int]:
    """Ensemble indexes whose bookie differs between two ensembles of the same size."""
    assert len(old) == len(new), (old, new)
    return [
        index for index, (before, after) in enumerate(zip(old, new, strict=True)) if before != after
    ]


def ack_quorum_reachable(
    indexes: Iterable[int], acked: Collection[int], down: Collection[int], ack_quorum: int
) -> bool:
    """Can an entry with write set `indexes` still collect `ack_quorum` acks?

    `acked` counts confirmed indexes, `down` the ones that failed and will not be retried.
    """
    possible = sum(1 for index in indexes if index in acked or index not in down)
    return possible >= ack_quorum
