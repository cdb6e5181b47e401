"""`bkaio stream info NS/STREAM` as text (bkaio/cli/stream_info.py): a part with nothing to show
says so. A stream truncated to nothing showed "records 0 (seq 5..None)" and, for its segments,
a bare "(none)" above the cursors' table, which read as "no cursors"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.stream import StreamPosition, open_namespace
from tests.unit.stream.conftest import ClientFactory


async def test_each_part_says_when_it_is_empty(
    make_client: ClientFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = await make_client()
    namespace = await open_namespace(bk, "tenant", create=True)
    writer = await namespace.open_writer("orders")
    await asyncio.gather(*(writer.write(b"r%d" % i) for i in range(3)))
    await writer.close()
    await namespace.create_stream("empty")
    base = ["stream", "info", "--metadata", f"sqlite://{tmp_path / 'meta.db'}"]

    async def info(name: str) -> str:
        assert await asyncio.to_thread(main, [*base, name]) == 0
        out: str = capsys.readouterr().out
        assert "None" not in out and "(none)" not in out, out
        return out

    text = await info("tenant/orders")
    assert "records    3 (seq 0..2)" in text and "LEDGER_ID" in text, text
    assert text.rstrip().endswith("no cursors"), text

    text = await info("tenant/empty")
    assert "records    0 (next seq 0)" in text and "no segments" in text, text

    await namespace.truncate("orders", before=StreamPosition(-1, -1, 3), force=True)
    text = await info("tenant/orders")
    assert "records    0 (next seq 3)" in text, text
    assert "\n\nno segments\n\nno cursors" in text, text
