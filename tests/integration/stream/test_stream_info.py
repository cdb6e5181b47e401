"""`bkaio stream info NS/STREAM` against real bookies: segments, seqs, bytes, retention, cursors."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.fixtures.bookies import BookieCluster, running_on_own_loop
from tests.integration.stream.test_stream_cli import invoke, rows


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    """Three bookies started once for the module, on an event loop of its own (the tests'
    loops are per test): each test uses a namespace of its own and none stops a bookie."""
    base = tmp_path_factory.mktemp("stream-info")
    bookies = BookieCluster(f"sqlite://{base / 'meta.db'}", base, count=3)
    with running_on_own_loop(bookies):
        yield bookies


async def test_stream_info_reports_segments_seqs_bytes_retention_and_cursors(
    cluster: BookieCluster,
) -> None:
    uri = cluster.metadata_uri
    rows(await invoke(uri, "create", "ns", "--retention-seconds", "3600", "--json"))
    rows(await invoke(uri, "create", "ns/events", "--json"))

    empty = rows(await invoke(uri, "info", "ns/events", "--json"))
    assert empty["records"] == 0 and empty["last_seq"] is None and empty["cursors"] == []

    for args, stdin in ((("--json",), "a\nbb\nccc\n"), (("dddd", "--json"), None)):
        written = await invoke(uri, "write", "ns/events", *args, stdin=stdin)
        assert written.exit_code == 0, (written.output, written.exception)
    await invoke(uri, "tail", "ns/events", "--no-follow", "--count", "2", "--cursor", "c1")

    report = rows(await invoke(uri, "info", "ns/events", "--json"))
    assert report["stream"] == "ns/events"
    assert (report["first_seq"], report["last_seq"], report["records"]) == (0, 3, 4)
    sealed = [s for s in report["segments"] if s["state"] == "closed"]
    assert [s["first_seq"] for s in sealed] == [0, 3]  # One segment per CLI write.
    assert [s["last_seq"] for s in sealed] == [2, 3]
    assert report["bytes"] == sum(s["bytes"] for s in sealed) > 0
    assert report["retention"] == {"seconds": 3600.0, "bytes": None, "ignores_cursors": False}
    [cursor] = report["cursors"]
    assert cursor["cursor"] == "c1" and cursor["lag"] == 2

    human = await invoke(uri, "info", "ns/events")
    assert human.exit_code == 0, human.output
    assert "4 (seq 0..3)" in human.output and "c1" in human.output
    json.dumps(report)  # Plain data throughout.


async def test_stream_info_of_a_missing_stream_fails_cleanly(cluster: BookieCluster) -> None:
    rows(await invoke(cluster.metadata_uri, "create", "ns-empty", "--json"))
    missing = await invoke(cluster.metadata_uri, "info", "ns-empty/nope", "--json")
    assert missing.exit_code != 0 and "nope" in str(missing.exception)
    bad = await invoke(cluster.metadata_uri, "info", "no-slash")
    assert bad.exit_code != 0 and "NAMESPACE/STREAM" in bad.output + bad.exception
