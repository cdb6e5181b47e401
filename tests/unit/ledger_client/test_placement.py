"""Placement policies: distinct writable bookies, rack spreading, replacements."""

from __future__ import annotations

import itertools
import random

import pytest

from bkaio.errors import ConfigError, NotEnoughBookiesError
from bkaio.ledger_client.placement import RackAwarePlacement, RandomPlacement, make_placement
from bkaio.meta.bookies import BookieInfo


def bookie(port: int, rack: str = "/default-rack", read_only: bool = False) -> BookieInfo:
    return BookieInfo(bookie_id=f"h:{port}", host="h", port=port, rack=rack, read_only=read_only)


def test_random_placement_picks_distinct_writable_bookies() -> None:
    bookies = [bookie(1), bookie(2), bookie(3, read_only=True), bookie(4)]
    for seed in range(20):
        ensemble = RandomPlacement(random.Random(seed)).new_ensemble(bookies, 3, 2)
        assert sorted(ensemble) == ["h:1", "h:2", "h:4"]


def test_too_few_writable_bookies_is_not_enough_bookies() -> None:
    with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, have 2"):
        RandomPlacement().new_ensemble([bookie(1), bookie(2), bookie(3, read_only=True)], 3, 2)


def test_replacement_avoids_the_ensemble_and_the_excluded() -> None:
    bookies = [bookie(p) for p in range(1, 6)]
    replacement = RandomPlacement(random.Random(3)).replace_bookie(
        bookies, ["h:1", "h:2", "h:3"], 1, 2, exclude={"h:4"}
    )
    assert replacement == "h:5"
    with pytest.raises(NotEnoughBookiesError, match="no writable bookie can replace h:2"):
        RandomPlacement().replace_bookie(bookies[:3], ["h:1", "h:2", "h:3"], 1, 2)


def test_rack_aware_ensemble_alternates_racks() -> None:
    bookies = [bookie(1, "/r1"), bookie(2, "/r1"), bookie(3, "/r2"), bookie(4, "/r2")]
    racks = {b.bookie_id: b.rack for b in bookies}
    for seed in range(20):
        ensemble = RackAwarePlacement(random.Random(seed)).new_ensemble(bookies, 4, 2)
        assert len(set(ensemble)) == 4
        assert all(racks[a] != racks[b] for a, b in itertools.pairwise(ensemble))


def test_rack_aware_falls_back_to_one_rack() -> None:
    bookies = [bookie(1), bookie(2), bookie(3)]
    assert sorted(RackAwarePlacement().new_ensemble(bookies, 3, 3)) == ["h:1", "h:2", "h:3"]


def test_rack_aware_replacement_prefers_a_rack_the_neighbours_do_not_use() -> None:
    bookies = [bookie(1, "/r1"), bookie(2, "/r2"), bookie(3, "/r1"), bookie(4, "/r2")]
    bookies += [bookie(5, "/r1"), bookie(6, "/r3")]
    for seed in range(10):
        chosen = RackAwarePlacement(random.Random(seed)).replace_bookie(
            bookies, ["h:1", "h:2", "h:3", "h:4"], 1, 2
        )
        assert chosen == "h:6"


def test_unknown_placement_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="placement='nearest'"):
        make_placement("nearest")
