"""A long poll waits no longer than `server.max_long_poll_seconds`, whatever timeout its client
asks for: a waiting poll keeps its connection from the idle timeout, so a client could
otherwise hold its poll slots (and connection) for up to ~49 days (a u32 of ms)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.bookie.read_entries import read_entries, wait_for_lac
from bkaio.bookie.server import ShardServer
from bkaio.config.sections import ServerConfig
from bkaio.errors import ConfigError
from bkaio.protocol import I64_MAX, Flag, ReadEntriesRequest, ReadEntriesResponse, Status
from tests.fixtures.shard import served_shard

LEDGER = 3
U32_MAX = 2**32 - 1
CAP = "max_long_poll_seconds = 1.0\n"  # The lowest allowed: a client's long-poll round.


def _capped(server: ShardServer) -> float | None:
    return server.metrics.registry.get_sample_value(
        "bkaio_bookie_limit_hits_total", {"limit": "max_long_poll_seconds"}
    )


async def test_an_entries_poll_asking_for_more_than_the_cap_is_answered_at_the_cap(
    tmp_path: Path,
) -> None:
    async with served_shard(tmp_path, CAP) as (server, _storage):
        poll = ReadEntriesRequest(
            1, LEDGER, 0, I64_MAX, 1, 100, 1 << 20, Flag.LONG_POLL, -1, U32_MAX
        )
        # Not the ~49 days asked for: answered as an expired poll is, with the LAC alone.
        answer = await asyncio.wait_for(read_entries(server, poll), 30)
        assert isinstance(answer, ReadEntriesResponse) and answer.status is Status.OK
        assert (answer.lac, answer.next_entry_id, answer.records_bytes) == (-1, 0, b"")
        assert not server.lac_waiters  # Its slot is free again.
        assert _capped(server) == 1


async def test_a_lac_poll_asking_for_more_than_the_cap_is_answered_at_the_cap(
    tmp_path: Path,
) -> None:
    async with served_shard(tmp_path, CAP) as (server, _storage):
        assert await asyncio.wait_for(wait_for_lac(server, LEDGER, -1, U32_MAX), 30) == -1
        assert _capped(server) == 1
        # A poll within the cap is not counted as capped.
        assert await asyncio.wait_for(wait_for_lac(server, LEDGER, -1, 1), 30) == -1
        assert _capped(server) == 1


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_the_cap_must_be_positive(value: float) -> None:
    with pytest.raises(ConfigError, match=f"server.max_long_poll_seconds={value} must be > 0"):
        ServerConfig(max_long_poll_seconds=value)


@pytest.mark.parametrize("value", [0.05, 0.999])
def test_the_cap_is_at_least_a_client_s_long_poll_round(value: float) -> None:
    # Below it every idle tail round would end early with nothing new, which tailing readers
    # take for bookies that cannot wait, and back off.
    with pytest.raises(ConfigError, match=f"server.max_long_poll_seconds={value} must be >= 1"):
        ServerConfig(max_long_poll_seconds=value)
