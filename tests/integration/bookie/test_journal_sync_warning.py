"""`journal.sync = false` stays possible (BookKeeper's journalSyncData=false) but is loud: a real
bookie running that way says so at WARNING when it starts, in `bkaio bookie info`, in
`bkaio shell listbookies` (its registration carries it), in the admin `/status` and as the
`bkaio_journal_sync_enabled` gauge; a bookie that syncs says the opposite everywhere."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.fixtures.bookies import BookieClusterFactory, BookieProcess

BKAIO = str(Path(sys.executable).parent / "bkaio")


def _bkaio_json(*args: str) -> Any:
    done = subprocess.run(
        [BKAIO, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "BKAIO_LOG_LEVEL": "error"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5.0) as response:
        return str(response.read().decode())


def _warnings(bookie: BookieProcess) -> list[dict[str, Any]]:
    found = []
    for line in bookie.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "journal_sync_disabled":
                found.append(record)
    return found


async def test_journal_sync_off_is_shown_everywhere(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    unsafe_cluster = await bookie_cluster_factory(
        config={"journal": {"sync": False}, "log": {"json": True}}
    )
    safe_cluster = await bookie_cluster_factory(
        metadata_uri=unsafe_cluster.metadata_uri, config={"log": {"json": True}}
    )
    unsafe, safe = unsafe_cluster[0], safe_cluster[0]

    # At start, at WARNING (and only on the unsafe one).
    warned = await asyncio.to_thread(_warnings, unsafe)
    assert [record["level"] for record in warned] == ["warning"], unsafe.log_tail()
    assert "power failure" in warned[0]["hint"]
    assert await asyncio.to_thread(_warnings, safe) == []

    # `bkaio bookie info` (what the configuration resolves to).
    for bookie, expected in ((unsafe, False), (safe, True)):
        info = await asyncio.to_thread(
            _bkaio_json, "bookie", "info", "--config", str(bookie.config_path)
        )
        assert info["journal_sync"] is expected, info

    # `bkaio shell listbookies` (from the registrations).
    listed = await asyncio.to_thread(
        _bkaio_json, "shell", "listbookies", "--metadata", unsafe_cluster.metadata_uri
    )
    by_id = {row["bookie_id"]: row for row in listed}
    assert by_id[unsafe.bookie_id]["journal_sync"] is False, listed
    assert by_id[safe.bookie_id]["journal_sync"] is True, listed
    registered = await unsafe_cluster.registered()
    assert registered[unsafe.bookie_id].journal_sync is False
    assert registered[safe.bookie_id].journal_sync is True

    # Admin HTTP: /status and the state and info endpoints.
    for bookie, expected in ((unsafe, False), (safe, True)):
        for path in ("/status", "/api/v1/bookie/state", "/api/v1/bookie/info"):
            body = json.loads(await asyncio.to_thread(_get, bookie.admin_url + path))
            assert body["journal_sync"] is expected, (path, body)

    # The gauge.
    for bookie, value in ((unsafe, "0.0"), (safe, "1.0")):
        metrics = await asyncio.to_thread(_get, bookie.admin_url + "/metrics")
        assert f"bkaio_journal_sync_enabled {value}" in metrics.splitlines(), metrics[:2000]
