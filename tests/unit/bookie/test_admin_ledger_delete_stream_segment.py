"""`DELETE /api/v1/ledger/delete` refuses (409 LedgerNamedByStreamError, naming the stream and
the segment's seqs) a ledger a stream's record names as a segment, unless `force=true`, as
`bkaio shell deleteledger` does without --force: it deleted it, and the stream then failed
every read from that segment on, its records lost. A stream's ledger no record names (an
orphan), a plain ledger and one whose tag names no possible stream are deleted as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bkaio.bookie.admin import build_admin_app
from bkaio.errors import NoSuchLedgerError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta import Metadata
from bkaio.stream import open_namespace
from bkaio.stream.segments import STREAM_KEY
from bkaio.stream.store import metadata_of
from tests.unit.bookie.fake_admin_host import FakeAdminHost, admin_config
from tests.unit.stream.conftest import ClientFactory, fake_bookies, make_client
from tests.unit.stream.test_orphans import crash_between_create_and_cas

__all__ = ["fake_bookies", "make_client"]  # Fixtures of the stream tests, used here.

TOKEN = "admin-secret"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


class HostWithMetadata(FakeAdminHost):
    def __init__(self, tmp_path: Path, metadata: Metadata) -> None:
        super().__init__(admin_config(tmp_path, "127.0.0.1", 45181, TOKEN))
        self._metadata = metadata

    @property
    def admin_metadata(self) -> Metadata | None:
        return self._metadata


@pytest.fixture
async def bk(make_client: ClientFactory) -> BookKeeper:
    return await make_client()


@pytest.fixture
async def client(tmp_path: Path, bk: BookKeeper) -> AsyncIterator[TestClient[Any, Any]]:
    app: web.Application = build_admin_app(HostWithMetadata(tmp_path, metadata_of(bk)))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def delete(client: TestClient[Any, Any], query: str) -> tuple[int, dict[str, Any]]:
    response = await client.delete(f"/api/v1/ledger/delete?{query}", headers=AUTHORIZED)
    assert response.content_type == "application/json", await response.text()
    return response.status, await response.json()


async def test_a_stream_segment_needs_force(client: TestClient[Any, Any], bk: BookKeeper) -> None:
    namespace = await open_namespace(bk, "tenant", create=True)
    writer = await namespace.open_writer("orders")
    await asyncio.gather(*(writer.write(b"r%d" % i) for i in range(3)))
    await writer.close()
    live = await namespace.open_writer("orders")  # A second segment, open, from seq 3.
    await live.write(b"r3")
    sealed, open_segment = (await namespace.stream_metadata("orders")).segments
    orphan = await crash_between_create_and_cas(bk, "orders", 9)
    plain = await bk.create_ledger(1, 1, 1, password=b"")
    await plain.close()
    # Tagged with a name no stream can have ('/' in it): no record names it.
    odd = await bk.create_ledger(
        1, 1, 1, password=b"", custom_metadata={STREAM_KEY: b"tenant/orders/x"}
    )
    await odd.close()

    for segment, first, last, seqs in (
        (sealed, 0, 2, "seq 0..2"),
        (open_segment, 3, None, "seq 3..)"),
    ):
        status, answer = await delete(client, f"ledger_id={segment.ledger_id}")
        assert status == 409, answer
        assert answer["kind"] == "LedgerNamedByStreamError"
        assert answer["ledger_id"] == segment.ledger_id
        assert (answer["stream"], answer["first_seq"], answer["last_seq"]) == (
            "tenant/orders", first, last
        )  # fmt: skip
        assert answer["error"].startswith(
            f"ledger {segment.ledger_id} is a segment of stream tenant/orders ({seqs}"
        ), answer
        assert "force=true" in answer["error"], answer
        await bk.get_ledger_metadata(segment.ledger_id)  # Still there.

    status, answer = await delete(client, f"ledger_id={sealed.ledger_id}&force=maybe")
    assert (status, answer["kind"]) == (400, "BadRequest"), answer
    for ledger_id in (orphan, plain.ledger_id, odd.ledger_id):
        assert await delete(client, f"ledger_id={ledger_id}") == (200, {"deleted": ledger_id})
    status, answer = await delete(client, f"ledger_id={sealed.ledger_id}&force=true")
    assert (status, answer) == (200, {"deleted": sealed.ledger_id})
    for ledger_id in (sealed.ledger_id, orphan, plain.ledger_id, odd.ledger_id):
        with pytest.raises(NoSuchLedgerError):
            await bk.get_ledger_metadata(ledger_id)
    status, answer = await delete(client, f"ledger_id={orphan}")
    assert (status, answer["kind"]) == (404, "NoSuchLedgerError"), answer
    await live.close()
