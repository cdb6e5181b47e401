"""Bookie metrics: what a shard worker records, how it ships them, how the parent exports them.

Each shard worker records into its own prometheus-client registry (plus whatever the journal and
storage packages register in the default registry of that process). On a scrape, the parent asks
every worker for a snapshot over its control pipe (`snapshot_registry`, bkaio/metric_snapshots.py:
plain JSON-able lists), then `AggregatingCollector` sums the samples of all shards (counters,
histogram buckets, gauges) and the parent's registry renders them as Prometheus text. Nothing
here touches sockets.

Names follow Prometheus conventions (seconds, `_total`); docs/bookie.md maps them to the
BookKeeper names (`bookkeeper_server_ADD_ENTRY_REQUEST` is
`bkaio_bookie_request_seconds{op="add_entry"}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from bkaio.journal.stats import SYNC_LATENCY_BUCKETS
from bkaio.metric_snapshots import SnapshotFamily, merge_snapshots

from .loop_metrics import LoopCounter, LoopHistogram

# Requests complete in 0.1 ms (reads from the write cache) to seconds (a slow fsync).
LATENCY_BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
OPS = (
    "hello",
    "add_entry",
    "read_entry",
    "read_range",
    "read_entries",
    "read_lac",
    "write_lac",
    "force",
    "get_bookie_info",
    "list_entries",
    "ping",
)

REJECT_REASONS = (
    "wrong_shard",
    "read_only",
    "bad_digest",
    "bad_auth_token",
    "unauthorized_ledger_key",
    "duplicate_request_id",
)
# Every configured limit (docs/security.md): each hit counts once in
# bkaio_bookie_limit_hits_total{limit}, so an operator sees which bound a client ran into.
LIMITS = (
    "max_frame_bytes",
    "max_entry_bytes",
    "max_inflight_per_connection",
    "write_buffer_high_bytes",
    "max_memory_bytes",
    "write_cache_bytes",
    "max_connections",
    "hello_timeout",
    "frame_read_timeout",
    "idle_timeout",
    "max_read_range_count",
    "max_read_range_bytes",
    "max_long_poll_waiters",
    "max_long_poll_seconds",
    "auth_failure_delay",
)
LEDGER_KEY_CHECK_RESULTS = ("accepted", "wrong_key", "no_metadata", "lookup_failed")
CLOSE_REASONS = (
    "protocol_error",
    "max_connections",
    "stopping",
    "hello_timeout",
    "frame_read_timeout",
    "idle_timeout",
)


class ShardMetrics:
    """The metrics one shard worker records. Hot-path children are cached (labels() costs)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # Updated for every request: the loop-only kinds (bkaio/bookie/loop_metrics.py).
        self.request_seconds = LoopHistogram(
            "bkaio_bookie_request_seconds",
            "Time from decoding a request to queueing its response, by operation and outcome",
            ["op", "success"],
            LATENCY_BUCKETS_SECONDS,
            r,
        )
        self.requests_rejected = Counter(
            "bkaio_bookie_requests_rejected",
            "Requests refused before reaching storage, by reason",
            ["reason"],
            registry=r,
        )
        self.event_loop_lag = LoopHistogram(
            "bkaio_bookie_event_loop_lag_seconds",
            "How much later than scheduled the shard's event loop ran a periodic timer",
            [],
            LATENCY_BUCKETS_SECONDS,
            r,
        ).labels()
        self.add_entry_bytes = LoopCounter(
            "bkaio_bookie_add_entry_bytes", "Payload bytes of acknowledged adds", r
        )
        self.read_entry_bytes = Counter(
            "bkaio_bookie_read_entry_bytes", "Payload bytes returned by reads", registry=r
        )
        self.connections_accepted = Counter(
            "bkaio_bookie_connections_accepted", "Connections accepted", registry=r
        )
        self.connections_closed = Counter(
            "bkaio_bookie_connections_closed",
            "Connections closed by the bookie, by reason",
            ["reason"],
            registry=r,
        )
        self.protocol_errors = Counter(
            "bkaio_bookie_protocol_errors",
            "Malformed frames or requests received",
            registry=r,
        )
        self.connections = Gauge("bkaio_bookie_connections", "Open client connections", registry=r)
        self.inflight_requests = Gauge(
            "bkaio_bookie_inflight_requests", "Requests received and not yet answered", registry=r
        )
        self.inflight_bytes = Gauge(
            "bkaio_bookie_inflight_bytes",
            "Bytes of requests received and not yet answered, and the bounds of read answers "
            "being read (the global memory bound)",
            registry=r,
        )
        self.long_poll_waiters = Gauge(
            "bkaio_bookie_long_poll_waiters", "READ_LAC long polls waiting", registry=r
        )
        self.read_only = Gauge(
            "bkaio_bookie_read_only",
            "1 when the shard refuses adds (disk full or forced), else 0",
            registry=r,
        )
        self.shard_up = Gauge(
            "bkaio_bookie_shards_up", "Shard workers serving requests", registry=r
        )
        self.disk_usage_fraction_max = Gauge(
            "bkaio_bookie_disk_usage_fraction_max",
            "Highest usage fraction among the shard's disks",
            registry=r,
        )
        self.limit_hits = Counter(
            "bkaio_bookie_limit_hits",
            "Times a configured limit was reached (the request or connection was held back, "
            "capped or refused), by limit",
            ["limit"],
            registry=r,
        )
        self.auth_failures = Counter(
            "bkaio_bookie_auth_failures",
            "HELLOs refused for a missing or wrong auth token",
            registry=r,
        )
        self.ledger_key_checks = Counter(
            "bkaio_bookie_ledger_key_checks",
            "First-sight master keys checked against ledger metadata, by result",
            ["result"],
            registry=r,
        )
        for limit in LIMITS:
            self.limit_hits.labels(limit=limit)
        for result in LEDGER_KEY_CHECK_RESULTS:
            self.ledger_key_checks.labels(result=result)
        self._limit_children = {limit: self.limit_hits.labels(limit=limit) for limit in LIMITS}
        # Children created up front: the series exist (at 0) before the first event.
        for reason in REJECT_REASONS:
            self.requests_rejected.labels(reason=reason)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason=reason)
        self._success: dict[str, Any] = {}
        self._failure: dict[str, Any] = {}
        # The add path's own child, so `observe_add` skips the lookups.
        add_child = self.request_seconds.labels(op="add_entry", success="true")
        self.observe_add = add_child.observe
        self.observe_adds = add_child.observe_many
        for op in OPS:
            self._success[op] = self.request_seconds.labels(op=op, success="true")
            self._failure[op] = self.request_seconds.labels(op=op, success="false")

    def limit_hit(self, limit: str) -> None:
        """Count one hit of `limit` (one of LIMITS)."""
        self._limit_children[limit].inc()

    def observe_request(self, op: str, seconds: float, success: bool) -> None:
        (self._success if success else self._failure)[op].observe(seconds)

    def bind_gauges(
        self,
        *,
        connections: Callable[[], float],
        inflight_requests: Callable[[], float],
        inflight_bytes: Callable[[], float],
        long_poll_waiters: Callable[[], float],
        read_only: Callable[[], float],
        disk_usage_fraction_max: Callable[[], float],
    ) -> None:
        """Gauges read at scrape time from the server's own counters: no hot-path cost."""
        self.connections.set_function(connections)
        self.inflight_requests.set_function(inflight_requests)
        self.inflight_bytes.set_function(inflight_bytes)
        self.long_poll_waiters.set_function(long_poll_waiters)
        self.read_only.set_function(read_only)
        self.disk_usage_fraction_max.set_function(disk_usage_fraction_max)
        self.shard_up.set(1)


class AggregatingCollector(Collector):
    """A collector over the latest per-shard snapshots (the parent refreshes them per scrape)."""

    def __init__(self) -> None:
        self.snapshots: dict[int, list[SnapshotFamily]] = {}

    def collect(self) -> Iterable[Metric]:
        return merge_snapshots(self.snapshots[shard] for shard in sorted(self.snapshots))


def exported_metric_names(registries: Iterable[CollectorRegistry]) -> set[str]:
    """Every sample name the registries expose (for the dashboard test)."""
    names: set[str] = set()
    for registry in registries:
        for metric in registry.collect():
            names.update(sample.name for sample in metric.samples)
            names.add(metric.name)
    return names


class JournalStatsCollector(Collector):
    """Exports the journal's own counters (`bkaio.journal.JournalStats`) at scrape time.

    The journal counts once per group on the loop thread; reading those counters here costs the
    add path nothing. Group sizes come in power-of-two buckets, exported as a histogram.
    """

    def __init__(self, stats: Callable[[], list[Any]]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        all_stats = self._stats()
        if not all_stats:
            return []
        stats = _summed_stats(all_stats)
        families: list[Metric] = [
            CounterMetricFamily("bkaio_journal_records", "Records journaled", value=stats.records),
            CounterMetricFamily(
                "bkaio_journal_written_bytes",
                "Bytes written to journal files",
                value=stats.bytes_written,
            ),
            CounterMetricFamily(
                "bkaio_journal_syncs", "Journal fdatasync calls", value=stats.syncs
            ),
            CounterMetricFamily(
                "bkaio_journal_sync_seconds",
                "Total seconds spent writing and syncing journal groups",
                value=stats.sync_seconds_total,
            ),
            GaugeMetricFamily(
                "bkaio_journal_sync_seconds_max",
                "Slowest journal group write+sync since start",
                value=stats.max_sync_seconds,
            ),
        ]
        triggers = CounterMetricFamily(
            "bkaio_journal_group_triggers",
            "Why each group commit started (bytes, entries, queue_empty, wait)",
            labels=["trigger"],
        )
        triggers.add_metric(["bytes"], stats.trigger_bytes)
        triggers.add_metric(["entries"], stats.trigger_entries)
        triggers.add_metric(["queue_empty"], stats.trigger_queue_empty)
        triggers.add_metric(["wait"], stats.trigger_wait)
        families.append(triggers)
        families.append(
            CounterMetricFamily(
                "bkaio_journal_group_holds",
                "Groups (bursts) that waited for the next append (journal.adaptive_wait_us)",
                value=stats.holds,
            )
        )
        families.append(
            CounterMetricFamily(
                "bkaio_journal_group_holds_fruitless",
                "Waits that caught no append (waiting then pauses for a while)",
                value=stats.holds_fruitless,
            )
        )
        group_bounds = [float(2**index) for index in range(len(stats.group_records_histogram) - 1)]
        families.append(
            HistogramMetricFamily(
                "bkaio_journal_group_records",
                "Records per journal group commit (batch size)",
                buckets=_cumulative(group_bounds, stats.group_records_histogram),
                sum_value=stats.records,
            )
        )
        families.append(
            HistogramMetricFamily(
                "bkaio_journal_sync_latency_seconds",
                "Write+fdatasync time of each journal group commit (what every add waits for)",
                buckets=_cumulative(list(SYNC_LATENCY_BUCKETS), stats.sync_latency_histogram),
                sum_value=stats.sync_seconds_total,
            )
        )
        return families


def _cumulative(bounds: list[float], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket `counts` (one more than `bounds`: the last is past every bound) as
    Prometheus's cumulative (le, count) pairs ending with +Inf."""
    assert len(counts) == len(bounds) + 1, (len(bounds), len(counts))
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound, count in zip([*map(str, bounds), "+Inf"], counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return buckets


class _SummedStats:
    """The journals of one shard counted as one (sums; maxima for the max_ fields)."""

    def __init__(self, all_stats: list[Any]) -> None:
        self.records = sum(s.records for s in all_stats)
        self.bytes_written = sum(s.bytes_written for s in all_stats)
        self.syncs = sum(s.syncs for s in all_stats)
        self.sync_seconds_total = sum(s.sync_seconds_total for s in all_stats)
        self.max_sync_seconds = max(s.max_sync_seconds for s in all_stats)
        self.trigger_bytes = sum(s.trigger_bytes for s in all_stats)
        self.trigger_entries = sum(s.trigger_entries for s in all_stats)
        self.trigger_queue_empty = sum(s.trigger_queue_empty for s in all_stats)
        self.trigger_wait = sum(s.trigger_wait for s in all_stats)
        self.holds = sum(s.holds for s in all_stats)
        self.holds_fruitless = sum(s.holds_fruitless for s in all_stats)
        self.group_records_histogram = [
            sum(counts)
            for counts in zip(*(s.group_records_histogram for s in all_stats), strict=True)
        ]
        self.sync_latency_histogram = [
            sum(counts)
            for counts in zip(*(s.sync_latency_histogram for s in all_stats), strict=True)
        ]


def _summed_stats(all_stats: list[Any]) -> _SummedStats:
    return _SummedStats(all_stats)
