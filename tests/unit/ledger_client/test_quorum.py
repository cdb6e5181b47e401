"""Striping, coverage and segment arithmetic (pure)."""

from __future__ import annotations

import pytest

from bkaio.ledger_client.quorum import (
    ack_quorum_reachable,
    bookies_for_entry,
    coverage_still_possible,
    has_quorum_coverage,
    negatives_for_absence,
    segment_for_entry,
    with_new_segment,
    write_set,
)


def test_write_sets_stripe_round_robin_over_the_ensemble() -> None:
    assert [write_set(e, 4, 3) for e in range(4)] == [(0, 1, 2), (1, 2, 3), (2, 3, 0), (3, 0, 1)]
    assert write_set(7, 3, 3) == (1, 2, 0)


def test_absence_needs_one_more_negative_than_write_minus_ack_quorum() -> None:
    assert negatives_for_absence(3, 2) == 2
    assert negatives_for_absence(2, 2) == 1
    assert negatives_for_absence(3, 1) == 3


@pytest.mark.parametrize(
    ("answered", "covered"),
    [({0, 1}, True), ({0, 2}, True), ({0, 1, 2}, True), ({1}, False), (set(), False)],
)
def test_coverage_with_e3_qw2_qa2_needs_one_answer_in_every_write_set(
    answered: set[int], covered: bool
) -> None:
    # Write sets {0,1}, {1,2}, {2,0}: each needs Qw - Qa + 1 = 1 answer.
    assert has_quorum_coverage(answered, 3, 2, 2) is covered


def test_coverage_with_e_equal_qw_needs_e_minus_qa_plus_one_answers() -> None:
    assert not has_quorum_coverage({0}, 3, 3, 2)
    assert has_quorum_coverage({0, 2}, 3, 3, 2)


def test_coverage_becomes_impossible_when_a_write_set_lost_too_many() -> None:
    assert coverage_still_possible({0}, 3, 3, 2)
    assert not coverage_still_possible({0, 1}, 3, 3, 2)


def test_segment_lookup_picks_the_greatest_start_not_after_the_entry() -> None:
    ensembles = ((0, ("a", "b", "c")), (5, ("a", "d", "c")), (9, ("e", "d", "c")))
    assert segment_for_entry(ensembles, 0)[0] == 0
    assert segment_for_entry(ensembles, 4)[0] == 0
    assert segment_for_entry(ensembles, 5)[0] == 5
    assert segment_for_entry(ensembles, 100)[0] == 9
    assert bookies_for_entry(ensembles, 6, 2) == ("a", "d")


def test_new_segment_at_the_last_start_replaces_it() -> None:
    ensembles = ((0, ("a", "b", "c")),)
    assert with_new_segment(ensembles, 0, ("a", "d", "c")) == ((0, ("a", "d", "c")),)
    assert with_new_segment(ensembles, 3, ("a", "d", "c")) == (
        (0, ("a", "b", "c")),
        (3, ("a", "d", "c")),
    )


def test_new_segment_before_the_last_one_is_a_programmer_error() -> None:
    with pytest.raises(AssertionError):
        with_new_segment(((0, ("a",)), (4, ("b",))), 3, ("c",))


def test_ack_quorum_reachability_counts_acks_and_live_bookies() -> None:
    assert ack_quorum_reachable((0, 1), acked={0}, down={1}, ack_quorum=1)
    assert not ack_quorum_reachable((0, 1), acked=set(), down={1}, ack_quorum=2)
    assert ack_quorum_reachable((0, 1, 2), acked=set(), down={1}, ack_quorum=2)
