"""The ledger check: its arithmetic (which expected entries fall outside what a bookie lists),
and what it does when a registered bookie gives no entry list (SQLite metadata, a real
registration of a bookie address nobody listens on, the real bookie client)."""

from __future__ import annotations

import socket

from structlog.testing import capture_logs

from bkaio.autorecovery import Auditor, AutorecoveryMetrics, LedgerChecker
from bkaio.autorecovery.checker import missing_entries
from bkaio.autorecovery.cluster import ClusterView
from bkaio.meta import BookieInfo, LedgerMetadata, Metadata
from tests.unit.autorecovery.fake_leases import FakeLockLease


def test_missing_entries_against_inclusive_ranges() -> None:
    held = [(0, 4), (7, 7), (10, 12)]
    assert missing_entries(range(0, 14), held) == [5, 6, 8, 9, 13]
    assert missing_entries([1, 4, 7, 11], held) == []
    assert missing_entries(range(3), []) == [0, 1, 2]
    assert missing_entries([], held) == []


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _skipped(metrics: AutorecoveryMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "bkaio_autorecovery_ledger_check_skipped_total", {"reason": "no_answer"}
    )
    return 0.0 if value is None else value


async def test_a_bookie_without_an_entry_list_is_logged_counted_and_its_ledger_rechecked(
    meta: Metadata,
) -> None:
    """Suspect 1 of the soak failure: a registered bookie whose LIST_ENTRIES failed was skipped
    with a debug line, its ledger judged fine until the next full check (a day by default), and
    the check asked only a watch-fed view which bookies exist. Now: the registry is asked, the
    skip is a WARNING and a counter, and the ledger is checked again soon, on its own."""
    silent = BookieInfo.for_address("127.0.0.1", _closed_port())  # Registered, not answering.
    registration = await meta.bookies.register(silent, 30.0)
    others = ("127.0.0.1:1", "127.0.0.1:2")  # Not registered: the bookie check's, not ours.
    md = await meta.ledgers.create(
        LedgerMetadata(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            ensembles=((0, (silent.bookie_id, *others)),),
        )
    )
    await meta.ledgers.update(md.closed(9, 100))
    view = ClusterView(meta)
    await view.start()
    view.set_bookies([])  # The watch lags: the view shows no bookie at all.
    metrics = AutorecoveryMetrics()
    clock = FakeClock()
    auditor = Auditor(
        meta,
        metrics,
        lease=FakeLockLease(),
        lost_bookie_delay_seconds=60.0,
        audit_interval_seconds=3600.0,
        checker=LedgerChecker(view, metrics),
        ledger_check_interval_seconds=86400.0,
        clock=clock,
    )
    try:
        await auditor.audit_once()  # The next periodic audit is an hour away.
        with capture_logs() as logs:
            assert await auditor.check_ledgers() == 0
        assert auditor.unchecked_ledgers == {md.ledger_id}
        assert _skipped(metrics) == 1
        assert metrics.registry.get_sample_value("bkaio_autorecovery_ledgers_unchecked") == 1
        (line,) = [entry for entry in logs if entry["log_level"] == "warning"]
        assert line["event"] == "ledger_check_unchecked" and line["ledgers_unchecked"] == 1
        assert line["ledgers_by_bookie"] == {silent.bookie_id: 1}
        assert line["last_reason_by_bookie"][silent.bookie_id].startswith("no_answer")
        assert 0 < auditor.next_wait() <= 5.0  # Soon, not in a day.
        clock.now += 5.0
        await auditor.recheck_ledgers()
        assert _skipped(metrics) == 2 and auditor.unchecked_ledgers == {md.ledger_id}
        await registration.deregister()  # Gone: the bookie check's now, nothing to check.
        clock.now += 300.0
        await auditor.recheck_ledgers()
        assert auditor.unchecked_ledgers == set() and _skipped(metrics) == 2
        assert metrics.registry.get_sample_value("bkaio_autorecovery_ledgers_unchecked") == 0
    finally:
        await view.close()
