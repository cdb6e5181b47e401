"""`bkaio stream ...` commands (the click group in bkaio/cli/stream_cmd.py) against real bookies."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer
from tests.fixtures.standalone import BKAIO


@dataclass(frozen=True)
class Result:
    """What one `bkaio stream ...` process printed, and how it ended."""

    exit_code: int
    output: str  # Standard output.
    exception: str  # Standard error: the one-line error of a failed command.


async def invoke(uri: str, *args: str, stdin: str | None = None) -> Result:
    """The real `bkaio stream` command in a child process. Not in a thread of this process: the
    etcd client's gRPC runs on one event loop per process at a time, and this test's loop uses
    it too."""
    child = await asyncio.create_subprocess_exec(
        BKAIO,
        "stream",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "BKAIO_METADATA": uri},
    )
    try:
        out, err = await asyncio.wait_for(
            child.communicate(None if stdin is None else stdin.encode()), 120
        )
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode is not None
    return Result(child.returncode, out.decode(), err.decode())


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
    assert bad.exit_code != 0 and "NAMESPACE/STREAM" in bad.output + bad.exception
