"""The shipped deploy files: the example config loads, the dashboard queries real metrics, the
systemd unit parses."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bkaio.autorecovery.metrics import AutorecoveryMetrics
from bkaio.bookie.metrics import (
    AggregatingCollector,
    JournalStatsCollector,
    ShardMetrics,
    exported_metric_names,
)
from bkaio.config import load_bookie_config
from bkaio.journal import JournalStats
from bkaio.metric_snapshots import merge_snapshots, snapshot_registry
from bkaio.process_metrics import ProcessesCollector
from bkaio.supervision import task_failures_counter

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
# PromQL words that look like metric names but are functions, keywords or label names.
_PROMQL_WORDS = {
    "histogram_quantile", "sum", "by", "le", "rate", "max", "count", "or", "vector", "and",
    "on", "op", "success", "job", "instance", "reason", "label_values", "without", "increase",
    "min", "task", "process",
}  # fmt: skip


def _bookie_registry() -> CollectorRegistry:
    """The parent's registry as it is when the shards report (what /metrics renders)."""
    shard = ShardMetrics()
    shard.registry.register(JournalStatsCollector(lambda: [JournalStats()]))
    shard.bind_gauges(
        connections=lambda: 0,
        inflight_requests=lambda: 0,
        inflight_bytes=lambda: 0,
        long_poll_waiters=lambda: 0,
        read_only=lambda: 0,
        disk_usage_fraction_max=lambda: 0,
    )
    task_failures_counter(shard.registry).labels(task="flush").inc()
    AutorecoveryMetrics(shard.registry)  # Autorecovery runs in the parent; same names.
    aggregate = AggregatingCollector()
    aggregate.snapshots[0] = snapshot_registry([shard.registry])
    registry = CollectorRegistry()
    registry.register(aggregate)
    registry.register(ProcessesCollector(lambda: [("parent", os.getpid())]))
    from prometheus_client import Gauge

    Gauge("bkaio_bookie_registered", "registered", registry=registry).set(1)
    return registry


def test_example_config_loads() -> None:
    config = load_bookie_config(DEPLOY / "bookie.toml", env={})
    assert config.port == 3181 and config.admin.host == "127.0.0.1"
    assert config.storage[0].journal.directories == (Path("/var/lib/bkaio/journal/shard-0"),)


def test_dashboard_queries_only_metrics_the_bookie_exports() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "bkaio-bookie.json").read_text())
    exported = exported_metric_names([_bookie_registry()])
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert expressions
    for expression in expressions:
        stripped = re.sub(r'"[^"]*"', '""', expression)  # Label values are not names.
        stripped = re.sub(r"\[[^\]]*\]", "", stripped)  # Nor range selectors.
        names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", stripped)) - _PROMQL_WORDS
        unknown = {n for n in names if not n.replace(".", "").isdigit()} - exported
        assert not unknown, f"{expression!r} uses metrics the bookie does not export: {unknown}"


def test_shard_snapshots_are_summed() -> None:
    first, second = ShardMetrics(), ShardMetrics()
    first.observe_request("add_entry", 0.001, True)
    second.observe_request("add_entry", 0.002, True)
    second.observe_request("add_entry", 0.003, True)
    merged = merge_snapshots(
        [snapshot_registry([first.registry]), snapshot_registry([second.registry])]
    )
    family = next(m for m in merged if m.name == "bkaio_bookie_request_seconds")
    counts = {
        s.labels["success"]: s.value
        for s in family.samples
        if s.name.endswith("_count") and s.labels["op"] == "add_entry"
    }
    assert counts == {"true": 3.0, "false": 0.0}
    buckets = [
        s
        for s in family.samples
        if s.name.endswith("_bucket")
        and s.labels["op"] == "add_entry"
        and s.labels["success"] == "true"
    ]
    assert [float(s.labels["le"]) for s in buckets] == sorted(
        float(s.labels["le"]) for s in buckets
    )


UNIT = DEPLOY / "systemd" / "bkaio-bookie.service"
INSTALLED_BKAIO = "/opt/bkaio/venv/bin/bkaio"  # Where docs/deployment.md installs it.


def _unit_values(key: str) -> list[str]:
    return [
        line.split("=", 1)[1]
        for line in UNIT.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]


def test_systemd_unit_runs_the_venvs_bkaio_and_names_real_documentation() -> None:
    [exec_start] = _unit_values("ExecStart")
    program = exec_start.split()[0]
    assert program == INSTALLED_BKAIO and Path(program).is_absolute()
    assert exec_start.split()[1:3] == ["bookie", "--config"]
    documentation = " ".join(_unit_values("Documentation")).split()
    assert documentation
    for link in documentation:
        if link.startswith("file:"):  # The repository's own docs, where the guide installs it.
            relative = link.removeprefix("file:/opt/bkaio/src/")
            assert (DEPLOY.parent / relative).is_file(), link
        else:
            assert link.startswith("man:"), link
    assert INSTALLED_BKAIO in (DEPLOY.parent / "docs" / "deployment.md").read_text()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """`systemd-analyze verify` checks that ExecStart's program exists: verify a copy that runs
    this venv's bkaio, the one change the deployment guide's drop-in makes."""
    this_bkaio = Path(sys.executable).parent / "bkaio"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(INSTALLED_BKAIO, str(this_bkaio)))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # systemd-analyze exits 0 on unknown keys and bad values; it only prints them.
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
