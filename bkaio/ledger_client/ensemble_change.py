"""Which bookies an ensemble change picks, and when a writer must give up instead.

A ledger handle whose bookie fails an add replaces it (bookie_replacement.py). BookKeeper picks the
replacement among bookies not quarantined (`bookieQuarantineTime`) and, when none is left,
among the quarantined ones again: a writer whose every bookie refuses it (a TLS mismatch, a
wrong token, a cluster that is down) then swaps bookies forever, writing a new metadata
version each time. Here the same preference holds, with one hard rule on top:

- `BookieFailures` remembers, per handle, when each bookie last failed (quarantine, a client
  option) and which bookies failed since the handle last made progress (an add completed).
- A replacement is never a bookie that failed since the last progress: without progress, each
  registered bookie is tried at most once, so a writer that cannot write fails with
  NotEnoughBookiesError after at most as many ensemble changes as there are bookies.
- A quarantined bookie (failed before the last progress, within the quarantine) is taken only
  when the slot could not be left empty: some write set would fall below the ack quorum. So a
  rolling restart, in which every bookie fails once with progress in between, never leaves a
  writer without bookies, and a slot that can stay empty waits for a healthy bookie.
- A slot that stays empty ("down") is filled again by a later ensemble change once a healthy
  bookie (its own bookie included) is available.

Pure apart from the clock the caller passes; no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from bkaio.errors import BKError, NotEnoughBookiesError
from bkaio.ledger_client.placement import BookieCandidate, PlacementPolicy
from bkaio.ledger_client.quorum import write_sets


@dataclass(slots=True)
class BookieFailures:
    """The bookies that failed adds of one handle: when, why, and since the last progress."""

    quarantine_seconds: float
    failed_at: dict[str, float] = field(default_factory=dict)  # Bookie -> last failure time.
    causes: dict[str, BKError] = field(default_factory=dict)  # Bookie -> its last failure.
    since_progress: set[str] = field(default_factory=set)
    last_cause: BKError | None = None

    def failed(self, bookie_id: str, error: BKError, now: float) -> None:
        self.failed_at[bookie_id] = now
        self.causes[bookie_id] = error
        self.since_progress.add(bookie_id)
        self.last_cause = error

    def progress(self) -> None:
        """An add completed: the bookies that failed before may be tried again if needed."""
        self.since_progress.clear()

    def quarantined(self, now: float) -> set[str]:
        """Bookies that failed within the quarantine (they are replacements of last resort)."""
        limit = self.quarantine_seconds
        return {b for b, at in self.failed_at.items() if now - at < limit}

    def describe(self, bookie_ids: Collection[str]) -> str:
        """Why `bookie_ids` failed, for an error message: each distinct reason once (bookies
        that failed alike, as every bookie does after a TLS mismatch, share one line)."""
        alike: dict[str, list[str]] = {}
        for bookie_id in sorted(bookie_ids):
            cause = self.causes.get(bookie_id)
            if cause is not None:
                reason = f"{type(cause).__name__}: {str(cause).replace(bookie_id, '<bookie>')}"
                alike.setdefault(reason, []).append(bookie_id)
        return "; ".join(
            str(self.causes[members[0]])
            + (f" (and the same for {', '.join(members[1:])})" if len(members) > 1 else "")
            for members in alike.values()
        )


@dataclass(frozen=True, slots=True)
class ReplacementPlan:
    """The outcome of planning one ensemble change."""

    ensemble: tuple[str, ...]  # The new ensemble (a down slot keeps its old bookie's id).
    replaced: tuple[int, ...]  # Slots with a bookie that takes adds from the new segment on.
    down_mask: int  # Slots left without a working bookie: adds skip them.

    def ack_quorum_reachable(self, write_quorum: int, ack_quorum: int) -> bool:
        """Can every write set still collect `ack_quorum` acks from its live slots?"""
        size = len(self.ensemble)
        return all(
            sum(1 for index in indexes if not self.down_mask >> index & 1) >= ack_quorum
            for indexes in write_sets(size, write_quorum)
        )


def plan_replacements(
    *,
    placement: PlacementPolicy,
    bookies: Sequence[BookieCandidate],
    ensemble: Sequence[str],
    failed: Collection[int],
    down_mask: int,
    write_quorum: int,
    ack_quorum: int,
    failures: BookieFailures,
    now: float,
) -> ReplacementPlan:
    """Fill the `failed` slots and the slots in `down_mask` as the module doc says."""
    new_ensemble = list(ensemble)
    never = set(failures.since_progress)
    quarantined = failures.quarantined(now) | never
    registered = {b.bookie_id for b in bookies if not b.read_only}
    empty = sorted({*failed, *(i for i in range(len(ensemble)) if down_mask >> i & 1)})
    replaced: list[int] = []
    down = 0
    for index in empty:
        own = ensemble[index]
        if index not in failed and own in registered and own not in quarantined:
            replaced.append(index)  # A down slot whose own bookie is healthy again.
            continue
        try:
            new_ensemble[index] = placement.replace_bookie(
                bookies, new_ensemble, index, write_quorum, exclude=quarantined
            )
        except NotEnoughBookiesError:
            down |= 1 << index
        else:
            replaced.append(index)
    plan = ReplacementPlan(tuple(new_ensemble), tuple(replaced), down)
    # Last resort: a quarantined bookie (never one that failed since the last progress) for
    # an empty slot, while some write set cannot reach the ack quorum without it.
    for index in empty:
        if plan.ack_quorum_reachable(write_quorum, ack_quorum):
            break
        if not plan.down_mask >> index & 1:
            continue
        try:
            new_ensemble[index] = placement.replace_bookie(
                bookies, new_ensemble, index, write_quorum, exclude=never
            )
        except NotEnoughBookiesError:
            continue
        plan = ReplacementPlan(
            tuple(new_ensemble),
            tuple(sorted((*plan.replaced, index))),
            plan.down_mask & ~(1 << index),
        )
    return plan


def not_enough_bookies(
    ledger_id: int, plan: ReplacementPlan, ack_quorum: int, failures: BookieFailures
) -> NotEnoughBookiesError:
    """The error a writer fails with when `plan` leaves a write set below the ack quorum."""
    down = [b for i, b in enumerate(plan.ensemble) if plan.down_mask >> i & 1]
    tried = sorted(failures.since_progress)
    error = NotEnoughBookiesError(
        f"ledger {ledger_id}: cannot reach ack quorum {ack_quorum}: bookies {down} failed and "
        f"no other writable bookie can replace them (failed since the last acknowledged "
        f"entry: {tried}). Why: {failures.describe(down) or 'unknown'}"
    )
    error.__cause__ = failures.last_cause
    return error
