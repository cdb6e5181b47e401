"""Fixtures of the autorecovery unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bkaio.meta import Metadata, open_metadata


@pytest.fixture
async def meta(sqlite_metadata_uri: str) -> AsyncIterator[Metadata]:
    """Metadata of a new, initialised cluster on the embedded (SQLite) driver."""
    metadata = await open_metadata(sqlite_metadata_uri)
    try:
        yield metadata
    finally:
        await metadata.close()
