"""Prometheus metrics of autorecovery (one set per process, in the registry it is given).

BookKeeper names in brackets: replication worker (`REREPLICATE_OP`, `NUM_ENTRIES_WRITTEN`,
`NUM_BYTES_WRITTEN`, `NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED`), auditor
(`NUM_UNDER_REPLICATED_LEDGERS`, `AUDIT_BOOKIES_TIME`).

`metrics_page` is what `bkaio autorecovery --metrics-port` serves: the service's registry with
the process's default registry's `bkaio_*` families, each family once.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from bkaio.metric_snapshots import BkaioOnly, MergedRegistries


def metrics_page(registry: CollectorRegistry) -> CollectorRegistry:
    """The registry to serve for a process whose service records into `registry`.

    `registry` holds the service's metrics, its supervisor's task failures and the store's bad
    records; the process's default registry holds what library code counts there
    (`bkaio_lease_late_refreshes_total` of the auditor's and workers' leases, the task failures
    of jobs spawned with the default registry). Both are merged at each scrape, so a family in
    both (`bkaio_task_failures_total`) is shown once with every series; the default registry's
    `process_*` and `gc_*` are left out (`registry` has its own process collector).
    """
    page = CollectorRegistry()
    page.register(MergedRegistries([registry, BkaioOnly(REGISTRY)]))
    return page


class AutorecoveryMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.entries_replicated = Counter(
            "bkaio_autorecovery_entries_replicated",
            "Entries copied to a replacement bookie",
            registry=r,
        )
        self.bytes_replicated = Counter(
            "bkaio_autorecovery_bytes_replicated",
            "Payload bytes copied to a replacement bookie",
            registry=r,
        )
        self.fragments_replicated = Counter(
            "bkaio_autorecovery_fragments_replicated",
            "Fragments moved to a replacement bookie (metadata updated)",
            registry=r,
        )
        self.ledgers_replicated = Counter(
            "bkaio_autorecovery_ledgers_replicated",
            "Under-replicated ledgers fully re-replicated",
            registry=r,
        )
        self.ledgers_recovered = Counter(
            "bkaio_autorecovery_open_ledgers_recovered",
            "Open ledgers fenced and closed because their writer did not move off a lost bookie",
            registry=r,
        )
        self.replication_failures = Counter(
            "bkaio_autorecovery_replication_failures",
            "Re-replication attempts that failed and will be retried",
            registry=r,
        )
        self.ledger_seconds = Histogram(
            "bkaio_autorecovery_ledger_replication_seconds",
            "Time to re-replicate one ledger",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.ledgers_marked = Counter(
            "bkaio_autorecovery_ledgers_marked",
            "Ledgers the auditor marked under-replicated that were not marked already",
            registry=r,
        )
        self.audits = Counter(
            "bkaio_autorecovery_audits",
            "Audits run by this process while auditor, by what started them",
            ["reason"],
            registry=r,
        )
        self.is_auditor = Gauge(
            "bkaio_autorecovery_is_auditor",
            "1 while this process is the elected auditor",
            registry=r,
        )
        self.lost_bookies = Gauge(
            "bkaio_autorecovery_lost_bookies",
            "Bookies named by ledger metadata but not registered (auditor's last scan)",
            registry=r,
        )
        self.under_replicated_ledgers = Gauge(
            "bkaio_autorecovery_under_replicated_ledgers",
            "Ledgers marked under-replicated after the auditor's last audit",
            registry=r,
        )
        self.ledger_check_skipped = Counter(
            "bkaio_autorecovery_ledger_check_skipped",
            "Bookies of a ledger the ledger check got no entry list from (checked again later)",
            ["reason"],
            registry=r,
        )
        for reason in ("in_limbo", "no_answer"):  # Exported (as 0) before the first skip.
            self.ledger_check_skipped.labels(reason=reason)
        self.ledgers_unchecked = Gauge(
            "bkaio_autorecovery_ledgers_unchecked",
            "Ledgers the auditor's ledger check could not check completely and will check again",
            registry=r,
        )
        self.marks_kept = Counter(
            "bkaio_autorecovery_marks_kept",
            "Marks a worker gave back instead of completing: a copy on a bookie it could not "
            "reach (not registered now, or still short after the copy) is still missing",
            registry=r,
        )
        self.audit_seconds = Histogram(
            "bkaio_autorecovery_audit_seconds",
            "Duration of one auditor scan of the ledger metadata",
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
            registry=r,
        )
