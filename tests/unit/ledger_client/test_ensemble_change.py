"""Ensemble changes that end: quarantine, one try per bookie without progress, backoff, causes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from bkaio.errors import BKError, BookieUnavailableError, ConfigError, NotEnoughBookiesError
from bkaio.ledger_client.ensemble_change import BookieFailures, plan_replacements
from bkaio.ledger_client.placement import RandomPlacement
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta.bookies import BookieInfo
from tests.unit.ledger_client.cluster import fake_cluster


def _bookies(*ids: str) -> list[BookieInfo]:
    return [BookieInfo.for_address("10.0.0.1", int(b)) for b in ids]


async def test_a_writer_whose_every_bookie_refuses_fails_after_few_metadata_writes() -> None:
    """The TLS-mismatch livelock: every bookie fails every add at once."""
    for ensemble_size, write_quorum, ack_quorum in [(1, 1, 1), (2, 2, 1), (2, 1, 1), (2, 2, 2)]:
        cluster = fake_cluster(3)
        cluster.ops.down.update(cluster.ops.bookies)
        lh = await cluster.client.create_ledger(ensemble_size, write_quorum, ack_quorum)
        created = cluster.store.updates
        with pytest.raises(NotEnoughBookiesError) as caught:
            await asyncio.wait_for(lh.append(b"x"), 10)
        assert isinstance(caught.value.__cause__, BookieUnavailableError)
        assert "is down" in str(caught.value)  # The bookies' own reason is in the message.
        # At most one metadata write per registered bookie, and no growth after the failure.
        assert cluster.store.updates - created <= 3
        with pytest.raises(NotEnoughBookiesError):
            lh.append(b"later")
        await asyncio.sleep(0.05)
        assert cluster.store.updates - created <= 3


async def test_without_progress_a_failed_bookie_is_never_chosen_again_even_out_of_quarantine() -> (
    None
):
    cluster = fake_cluster(4, bookie_quarantine_seconds=0.001)
    lh = await cluster.client.create_ledger(2, 2, 2)
    cluster.ops.down.update(cluster.ops.bookies)
    result = await asyncio.gather(lh.append(b"a"), return_exceptions=True)
    assert isinstance(result[0], NotEnoughBookiesError)
    # Each of the 4 bookies was tried once: 2 in the first ensemble, the 2 others once.
    assert sum(cluster.ops.add_count.values()) <= 4
    assert len(lh.metadata.ensembles) == 1


async def test_a_rolling_restart_takes_a_quarantined_bookie_when_a_slot_cannot_stay_empty() -> None:
    cluster = fake_cluster(3)
    lh = await cluster.client.create_ledger(2, 2, 2)
    first = list(lh.metadata.ensembles[-1][1])
    spare = next(b for b in cluster.ops.bookies if b not in first)
    cluster.ops.down.add(first[0])
    assert await lh.append(b"a") == 0  # first[0] replaced by the spare.
    cluster.ops.down.discard(first[0])  # Restarted: back, but quarantined.
    cluster.ops.down.add(spare)
    assert await lh.append(b"b") == 1  # Only first[0] is left: taken although quarantined.
    assert set(lh.metadata.ensembles[-1][1]) == {first[0], first[1]}
    await lh.close()


async def test_a_slot_that_can_stay_empty_waits_for_a_healthy_bookie_then_is_filled() -> None:
    cluster = fake_cluster(3, bookie_quarantine_seconds=0.2)
    lh = await cluster.client.create_ledger(3, 3, 2)
    victim = lh.metadata.ensembles[0][1][0]
    cluster.ops.down.add(victim)
    assert await lh.append(b"a") == 0  # No spare: slot 0 stays empty, Qa = 2 still met.
    assert len(lh.metadata.ensembles) == 1
    cluster.ops.down.discard(victim)
    await asyncio.sleep(0.25)  # Out of quarantine.
    other = lh.metadata.ensembles[0][1][1]
    cluster.ops.down.add(other)  # The next change fills slot 0 with its own bookie again.
    assert await lh.append(b"b") == 1
    assert lh.metadata.ensembles[-1] == (1, lh.metadata.ensembles[0][1])
    cluster.ops.down.discard(other)
    assert await lh.append(b"c") == 2
    assert 2 in cluster.bookie(victim).ledgers[lh.ledger_id].entries
    await lh.close()


async def test_changes_in_one_quarantine_period_back_off() -> None:
    cluster = fake_cluster(5, ensemble_change_backoff_min=0.001, ensemble_change_backoff_max=0.002)
    lh = await cluster.client.create_ledger(2, 2, 2)
    for round_number in range(3):
        victim = lh.metadata.ensembles[-1][1][0]
        cluster.ops.down.add(victim)
        assert await lh.append(b"%d" % round_number) == round_number
    assert lh._change_backoff.failures == 2  # The first change went at once.
    await lh.close()


def test_the_plan_prefers_healthy_bookies_and_never_reuses_one_failed_since_progress() -> None:
    placement = RandomPlacement(random.Random(3))
    bookies = _bookies("1", "2", "3", "4")
    ids = [b.bookie_id for b in bookies]
    failures = BookieFailures(quarantine_seconds=30.0)
    failures.failed(ids[0], BookieUnavailableError("refused"), now=0.0)
    failures.progress()
    failures.failed(ids[1], BookieUnavailableError("refused"), now=1.0)
    plan = plan_replacements(
        placement=placement,
        bookies=bookies,
        ensemble=[ids[1], ids[2]],
        failed=[0],
        down_mask=0,
        write_quorum=2,
        ack_quorum=2,
        failures=failures,
        now=2.0,
    )
    assert plan.ensemble == (ids[3], ids[2]) and plan.replaced == (0,) and plan.down_mask == 0
    failures.failed(ids[3], BookieUnavailableError("refused"), now=3.0)
    plan = plan_replacements(
        placement=placement,
        bookies=bookies,
        ensemble=[ids[3], ids[2]],
        failed=[0],
        down_mask=0,
        write_quorum=2,
        ack_quorum=2,
        failures=failures,
        now=4.0,
    )
    # ids[0] failed before the last progress (quarantined): the last resort for Qa.
    assert plan.ensemble == (ids[0], ids[2]) and plan.down_mask == 0
    failures.failed(ids[0], BookieUnavailableError("refused"), now=5.0)
    plan = plan_replacements(
        placement=placement,
        bookies=bookies,
        ensemble=[ids[0], ids[2]],
        failed=[0],
        down_mask=0,
        write_quorum=2,
        ack_quorum=2,
        failures=failures,
        now=6.0,
    )
    assert plan.down_mask == 1 and not plan.ack_quorum_reachable(2, 2)


@pytest.mark.parametrize(
    "options",
    [
        {"bookie_quarantine_seconds": 0},
        {"ensemble_change_backoff_min": 0},
        {"ensemble_change_backoff_min": 3.0, "ensemble_change_backoff_max": 2.0},
    ],
)
def test_bad_ensemble_change_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ClientConfig(**options)


async def test_a_broken_ensemble_change_is_reported_counted_and_fails_the_handle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a bug in planning")

    monkeypatch.setattr("bkaio.ledger_client.bookie_replacement.plan_replacements", broken)
    before = REGISTRY.get_sample_value("bkaio_task_failures_total", {"task": "ensemble_change"})
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 3)  # Needs the replacement to complete.
    cluster.ops.down.add(lh.metadata.ensembles[0][1][0])
    with capture_logs() as logs, pytest.raises(BKError, match="internal error"):
        await asyncio.wait_for(lh.append(b"x"), 10)
    after = REGISTRY.get_sample_value("bkaio_task_failures_total", {"task": "ensemble_change"})
    assert (after or 0) - (before or 0) == 1
    (failed,) = [e for e in logs if e["event"] == "task_failed"]
    assert failed["log_level"] == "error" and "ensemble-change" in failed["task"]
    with pytest.raises(BKError):
        lh.append(b"later")
