"""`bkaio autorecovery --metrics-port`: the stand-alone autorecovery service serves its own
metrics and its process_* figures."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bkaio.testing.procs import LOOPBACK, free_port
from tests.fixtures.etcd import initialise_cluster_blocking

BKAIO = str(Path(sys.executable).parent / "bkaio")


def test_autorecovery_service_exports_process_and_autorecovery_metrics(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    initialise_cluster_blocking(uri)
    port = free_port()
    process = subprocess.Popen(
        [BKAIO, "autorecovery", "--metadata", uri, "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "bkaio_autorecovery_is_auditor" not in text:
            assert process.poll() is None, "autorecovery exited"
            assert time.monotonic() < deadline, "no metrics served"
            try:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                time.sleep(0.2)
        names = {family.name for family in text_string_to_metric_families(text)}
        assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= names
        assert "bkaio_autorecovery_ledgers_replicated" in names
    finally:
        process.terminate()
        process.wait(30)
