"""`bkaio shell clusterinfo` counts as under-replicated only the marks autorecovery can read, and
shows the records under /underreplicated/ that do not decode on their own line (and in the JSON),
so an operator sees both instead of one figure that mixed them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.meta import initialise_cluster_at, open_metadata
from bkaio.meta.autorecovery import UNDERREPLICATED_PREFIX


async def _one_mark_and_one_bad_record(uri: str) -> None:
    await initialise_cluster_at(uri)
    metadata = await open_metadata(uri)
    try:
        await metadata.underreplication.mark(1, ["gone:1"])
        await metadata.store.put(UNDERREPLICATED_PREFIX + f"{2:020d}", b"\xc1 not msgpack")
    finally:
        await metadata.close()


def test_the_table_and_the_json_show_bad_records_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    asyncio.run(_one_mark_and_one_bad_record(uri))
    assert main(["shell", "clusterinfo", "--metadata", uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "under-replicated     1" in lines
    assert any(line.startswith("undecodable marks    1 (") for line in lines), lines
    assert main(["shell", "clusterinfo", "--json", "--metadata", uri]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["under_replicated_ledgers"] == 1 and info["bad_underreplicated_records"] == 1
