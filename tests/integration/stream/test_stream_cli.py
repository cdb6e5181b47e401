"""`bkaio stream ...` commands (the click group in bkaio/cli/stream_cmd.py) against real bookies."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from click.testing import CliRunner, Result

from bkaio.cli.stream_cmd import stream
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer


async def invoke(uri: str, *args: str, stdin: str | None = None) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, stream, [*args], input=stdin, env={"BKAIO_METADATA": uri}
    )


def json_lines(result: Result) -> list[Any]:
    """`write` and `tail` print one JSON object per line (they stream)."""
    assert result.exit_code == 0, (result.output, result.exception)
    return [json.loads(line) for line in result.output.splitlines()]


def rows(result: Result) -> Any:
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.output)


async def test_stream_commands_round_trip(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    await bookie_cluster_factory(count=3, metadata_uri=etcd_server.uri)
    uri = etcd_server.uri
    created = rows(await invoke(uri, "create", "tenant-a", "--quota-bytes", "100000", "--json"))
    assert created["quota_bytes"] == 100_000
    assert rows(await invoke(uri, "create", "tenant-a/orders", "--json"))["stream"]
    written = json_lines(
        await invoke(uri, "write", "tenant-a/orders", "--json", stdin="one\ntwo\n")
    )
    assert [w["seq"] for w in written] == [0, 1]
    binary = json_lines(await invoke(uri, "write", "tenant-a/orders", "--hex", "00ff", "--json"))
    assert binary[0]["seq"] == 2
    tail = await invoke(uri, "tail", "tenant-a/orders", "--no-follow", "--cursor", "c1", "--json")
    lines = [json.loads(line) for line in tail.output.splitlines()]
    assert [line["payload"] for line in lines] == ["one", "two", "hex:00ff"]
    text = await invoke(uri, "tail", "tenant-a/orders", "--from", "1", "--count", "1", "--hex")
    assert text.exit_code == 0 and text.output.strip().endswith("hex:74776f")
    [cursor] = rows(await invoke(uri, "cursors", "tenant-a/orders", "--json"))
    assert cursor["cursor"] == "c1" and cursor["seq"] == 2 and cursor["lag"] == 0
    listed = rows(await invoke(uri, "list", "tenant-a", "--json"))
    assert [r["stream"] for r in listed] == ["orders"]
    assert {"namespace": "tenant-a"} in rows(await invoke(uri, "list", "--json"))
    truncated = rows(await invoke(uri, "truncate", "tenant-a/orders", "--before", "3", "--json"))
    assert truncated["first_seq"] >= 2  # Whole segments only: each CLI write was one segment.
    retained = rows(await invoke(uri, "retain", "tenant-a", "--json"))
    assert retained == []
    refused = await invoke(uri, "delete", "tenant-a")
    assert refused.exit_code != 0 and "still has 1 streams" in str(refused.exception)
    assert rows(await invoke(uri, "delete", "tenant-a", "--force", "--json")) == {
        "deleted": "tenant-a"
    }
    bad = await invoke(uri, "tail", "no-slash")
    assert bad.exit_code != 0 and "NAMESPACE/STREAM" in bad.output
