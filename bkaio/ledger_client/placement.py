"""Ensemble placement: which writable bookies a new ledger or an ensemble change gets.

Two policies, chosen by name (`placement="default" | "rack_aware"` on `BookKeeper.connect`):
- `RandomPlacement` picks distinct writable bookies uniformly at random;
- `RackAwarePlacement` spreads an ensemble over rack labels so that consecutive ensemble
  members (which share write sets) sit in different racks when the racks allow it, and
  picks a replacement from a rack its write-set neighbours do not use; with one rack, or no
  labels, it behaves like random placement (BookKeeper's fallback when not enforced).
Pure: the caller passes the current bookie list (from the registry watch) and a `random.Random`.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Protocol

from bkaio.errors import ConfigError, NotEnoughBookiesError

DEFAULT_RACK = "/default-rack"


class BookieCandidate(Protocol):
    """What placement needs to know of a bookie (bkaio.meta.BookieInfo satisfies it)."""

    @property
    def bookie_id(self) -> str: ...

    @property
    def rack(self) -> str | None: ...

    @property
    def read_only(self) -> bool: ...


class PlacementPolicy(Protocol):
    """Chooses ensembles among writable bookies."""

    def new_ensemble(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble_size: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> tuple[str, ...]: ...

    def replace_bookie(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> str: ...


def _writable(
    bookies: Sequence[BookieCandidate], exclude: Collection[str]
) -> list[BookieCandidate]:
    seen: set[str] = set()
    chosen: list[BookieCandidate] = []
    for bookie in bookies:
        if bookie.read_only or bookie.bookie_id in exclude or bookie.bookie_id in seen:
            continue
        seen.add(bookie.bookie_id)
        chosen.append(bookie)
    return chosen


def _enough_writable(
    bookies: Sequence[BookieCandidate], ensemble_size: int, exclude: Collection[str]
) -> list[BookieCandidate]:
    """The writable candidates for a new ensemble; NotEnoughBookiesError when too few."""
    candidates = _writable(bookies, exclude)
    if len(candidates) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} writable bookies, have {len(candidates)} "
            f"({sorted(b.bookie_id for b in candidates)}; excluded {sorted(exclude)})"
        )
    return candidates


def _rack(bookie: BookieCandidate) -> str:
    return bookie.rack or DEFAULT_RACK


class RandomPlacement:
    """Distinct writable bookies, uniformly at random."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble_size: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> tuple[str, ...]:
        """`ensemble_size` distinct writable bookies not in `exclude`."""
        candidates = _enough_writable(bookies, ensemble_size, exclude)
        return tuple(b.bookie_id for b in self._rng.sample(candidates, ensemble_size))

    def replace_bookie(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> str:
        """A writable bookie outside the ensemble and `exclude` for ensemble slot `index`."""
        candidates = _writable(bookies, {*exclude, *ensemble})
        if not candidates:
            raise NotEnoughBookiesError(
                f"no writable bookie can replace {ensemble[index]} (slot {index} of "
                f"{list(ensemble)}; excluded {sorted(exclude)})"
            )
        return self._rng.choice(candidates).bookie_id


class RackAwarePlacement:
    """Spreads ensembles over racks; falls back to random when the racks do not allow it."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def new_ensemble(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble_size: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> tuple[str, ...]:
        """Interleave racks so that neighbouring ensemble members differ in rack."""
        candidates = _enough_writable(bookies, ensemble_size, exclude)
        by_rack: dict[str, list[str]] = {}
        for bookie in candidates:
            by_rack.setdefault(_rack(bookie), []).append(bookie.bookie_id)
        for members in by_rack.values():
            self._rng.shuffle(members)
        # Each pick takes the fullest rack other than the previous pick's, so neighbouring
        # members (which share write sets) differ in rack while two racks have bookies left.
        chosen: list[str] = []
        previous_rack: str | None = None
        while len(chosen) < ensemble_size:
            racks = [rack for rack, members in by_rack.items() if members]
            options = [rack for rack in racks if rack != previous_rack] or racks
            rack = max(options, key=lambda r: (len(by_rack[r]), self._rng.random()))
            chosen.append(by_rack[rack].pop())
            previous_rack = rack
        return tuple(chosen)

    def replace_bookie(
        self,
        bookies: Sequence[BookieCandidate],
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        exclude: Collection[str] = (),
    ) -> str:
        """Prefer a bookie whose rack no write-set neighbour of slot `index` uses."""
        candidates = _writable(bookies, {*exclude, *ensemble})
        if not candidates:
            raise NotEnoughBookiesError(
                f"no writable bookie can replace {ensemble[index]} (slot {index} of "
                f"{list(ensemble)}; excluded {sorted(exclude)})"
            )
        size = len(ensemble)
        neighbours = {
            ensemble[(index + offset) % size]
            for offset in range(-(write_quorum - 1), write_quorum)
            if offset != 0
        }
        racks_known = {b.bookie_id: _rack(b) for b in bookies}
        used = {racks_known[b] for b in neighbours if b in racks_known}
        preferred = [b for b in candidates if _rack(b) not in used]
        return self._rng.choice(preferred or candidates).bookie_id


def make_placement(name: str, rng: random.Random | None = None) -> PlacementPolicy:
    """The placement policy called `name` ("default"/"random" or "rack_aware")."""
    if name in ("default", "random"):
        return RandomPlacement(rng)
    if name == "rack_aware":
        return RackAwarePlacement(rng)
    raise ConfigError(f"placement={name!r} is not one of 'default', 'random', 'rack_aware'")
