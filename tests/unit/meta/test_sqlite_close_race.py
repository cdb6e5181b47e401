"""A call made while an SQLite store is closing fails as on a closed store (MetadataError),
never with an assertion from a connection that is already gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.errors import MetadataError
from bkaio.meta.sqlite_driver import SqliteMetadataStore


async def test_a_read_during_close_is_a_metadata_error(tmp_path: Path) -> None:
    store = await SqliteMetadataStore.open(f"sqlite://{tmp_path}/meta.db")
    await store.put("/k", b"v")
    closing = asyncio.ensure_future(store.close())
    await asyncio.sleep(0)  # close() now waits for its worker thread to close the connection.
    with pytest.raises(MetadataError, match="closed"):
        await store.get("/k")
    await closing
