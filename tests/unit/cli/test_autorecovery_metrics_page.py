"""`bkaio autorecovery --metrics-port` serves the process's default registry's `bkaio_*`
families beside its own registry's, each family once: the auditor's and workers' leases count
late refreshes (`bkaio_lease_late_refreshes_total`) and library jobs count task failures in the
default registry, which the page, serving the service's registry alone, used to leave out; and
`bkaio_task_failures_total`, in both registries, must not be rendered twice."""

from __future__ import annotations

from typing import Any

import prometheus_client
import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bkaio.autorecovery.metrics import AutorecoveryMetrics, metrics_page
from bkaio.cli.main import main
from bkaio.meta.store import LATE_REFRESHES
from bkaio.supervision import task_failures_counter

# No cluster: the command stops after starting (see test_autorecovery_token.py).
SQLITE = "sqlite:////proc/nonexistent/meta.db"


class FakeMetricsServer:
    """Stands in for prometheus_client.start_http_server: keeps the registry it was given."""

    def __init__(self) -> None:
        self.registries: list[CollectorRegistry] = []

    def __call__(
        self, port: int, addr: str = "0.0.0.0", registry: Any = REGISTRY
    ) -> tuple[None, None]:
        self.registries.append(registry)
        return None, None  # The server and its thread, as the real one gives.


def test_the_page_shows_the_default_registrys_bkaio_families_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = FakeMetricsServer()
    monkeypatch.setattr(prometheus_client, "start_http_server", server)
    monkeypatch.setenv("BKAIO_ADMIN_TOKEN", "t")
    assert main(["autorecovery", "--metadata", SQLITE, "--metrics-port", "9"]) == 1
    [page] = server.registries
    # A library job's failure and a late lease refresh, both counted in the default registry.
    job_failures = task_failures_counter(REGISTRY).labels(task="fake_library_job")
    before = REGISTRY.get_sample_value("bkaio_lease_late_refreshes_total") or 0.0
    LATE_REFRESHES.inc()
    job_failures.inc()

    text = generate_latest(page).decode()
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert sorted(families) == sorted(set(families)), text
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    late = {s.name: s.value for s in parsed["bkaio_lease_late_refreshes"].samples}
    assert late["bkaio_lease_late_refreshes_total"] == before + 1
    failures = {
        s.labels["task"]: s.value
        for s in parsed["bkaio_task_failures"].samples
        if s.name == "bkaio_task_failures_total"
    }
    assert failures["fake_library_job"] >= 1
    assert "process_cpu_seconds" in parsed  # Its own registry's process collector is kept.


def test_a_family_in_both_registries_shows_every_series_once() -> None:
    own = CollectorRegistry()
    AutorecoveryMetrics(own)
    task_failures_counter(own).labels(task="replication_worker").inc(2)
    task_failures_counter(REGISTRY).labels(task="fake_library_job")  # Exported at 0.

    text = generate_latest(metrics_page(own)).decode()
    assert text.count("# TYPE bkaio_task_failures_total counter") == 1, text
    assert 'bkaio_task_failures_total{task="replication_worker"} 2.0' in text
    assert 'bkaio_task_failures_total{task="fake_library_job"}' in text
    assert "# TYPE bkaio_autorecovery_ledgers_replicated_total counter" in text
