"""The first contact with etcd gives up after its budget with one wording, whichever way the
budget ran out: every attempt refused at once, or the last attempt left unanswered. (On a slow
machine a refused connect can take as long as the whole budget, so which of the two happens is
chance; callers and operators must not see two different errors for one cause.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aetcd import rpc

from bkaio.errors import MetadataError
from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.uri import parse_etcd_uri

URI = "etcd://127.0.0.1:1/bkaio"


def _connection() -> EtcdConnection:
    connection = EtcdConnection(URI, parse_etcd_uri(URI))
    connection.members.append(Any)  # type: ignore[arg-type]  # One member; never used here.
    return connection


async def _refused() -> None:
    raise rpc.AioRpcError(rpc.StatusCode.UNAVAILABLE, details="failed to connect")


async def _silent() -> None:
    await asyncio.sleep(3600)


@pytest.mark.parametrize("call", [_refused, _silent], ids=["refused", "silent"])
async def test_the_budget_running_out_reads_the_same_either_way(call: Any) -> None:
    with pytest.raises(MetadataError, match=r"127\.0\.0\.1:1 unreachable for 0\.2 s"):
        await _connection().retrying("connect", call, idempotent=True, retry_seconds=0.2)
