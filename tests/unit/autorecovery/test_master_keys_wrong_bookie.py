"""`MasterKeys` asks a bookie's admin API for a ledger's key naming the bookie it means, so a
registered admin URL that reaches another bookie is an error naming admin.host, not that other
bookie's "no key here" taken for this one's (which made the ledger look as if nothing had ever
been written to it). With the default admin.host = 127.0.0.1 every bookie registered
http://127.0.0.1:<port>, which a process on another host followed to its own host.

The bookie answering here is the real admin app over a fake parent (tests/unit/bookie), on a
test server on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from structlog.testing import capture_logs

from bkaio.autorecovery.cluster import ClusterView, MasterKeys
from bkaio.autorecovery.fragments import ReplicationError
from bkaio.bookie.admin import build_admin_app
from bkaio.meta import BookieInfo, LedgerMetadata, Metadata
from bkaio.protocol.digest import password_check
from tests.unit.bookie.fake_admin_host import FakeAdminHost, admin_config

TOKEN = "admin-secret"
KEY = b"k" * 20
ANSWERING = ("127.0.0.1", 45182)  # The bookie that listens where the URL leads.
ANSWERING_ID = "127.0.0.1:45182"
REMOTE = "10.0.0.5:3181"  # A bookie on another host, which registered a loopback admin URL.


@pytest.fixture
async def answering(tmp_path: Path) -> AsyncIterator[tuple[FakeAdminHost, str]]:
    """The admin API of bookie ANSWERING, and its base URL."""
    host = FakeAdminHost(admin_config(tmp_path, *ANSWERING, TOKEN))
    app: web.Application = build_admin_app(host)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield host, f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


def ledger(ledger_id: int, bookie_id: str) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        ensembles=((0, (bookie_id,)),),
        password_hash=password_check(KEY),
    )


async def keys_over(meta: Metadata, info: BookieInfo) -> tuple[ClusterView, MasterKeys]:
    view = ClusterView(meta)
    view.set_bookies([info])
    return view, MasterKeys(view, TOKEN)


async def test_an_admin_url_that_reaches_another_bookie_is_an_error_naming_admin_host(
    meta: Metadata, answering: tuple[FakeAdminHost, str]
) -> None:
    host, url = answering
    info = BookieInfo(bookie_id=REMOTE, host="10.0.0.5", port=3181, admin_url=url)
    view, keys = await keys_over(meta, info)
    try:
        with pytest.raises(ReplicationError) as raised:
            await keys.master_key(ledger(7, REMOTE))
    finally:
        await keys.close()
        await view.close()
    message = str(raised.value)
    assert f"bookie {REMOTE}'s registered admin URL {url} reached bookie {ANSWERING_ID}" in (
        message
    )
    assert "admin.host" in message and "docs/deployment.md" in message
    assert host.keys_asked == []  # Refused before the other bookie looked up anything.


async def test_the_bookie_the_url_reaches_answers_when_it_is_the_one_meant(
    meta: Metadata, answering: tuple[FakeAdminHost, str]
) -> None:
    host, url = answering
    host.keys[7] = KEY.hex()
    info = BookieInfo(bookie_id=ANSWERING_ID, host=ANSWERING[0], port=ANSWERING[1], admin_url=url)
    view, keys = await keys_over(meta, info)
    try:
        with capture_logs() as logs:
            assert await keys.master_key(ledger(7, ANSWERING_ID)) == KEY
            assert await keys.master_key(ledger(8, ANSWERING_ID)) is None  # None recorded.
    finally:
        await keys.close()
        await view.close()
    assert host.keys_asked == [7, 8]
    # Advertised on loopback too: nothing to warn about.
    assert not [e for e in logs if e["event"] == "bookie_admin_url_on_loopback"], logs


async def test_a_loopback_admin_url_of_a_bookie_advertised_elsewhere_is_warned_once(
    meta: Metadata, answering: tuple[FakeAdminHost, str]
) -> None:
    _, url = answering
    info = BookieInfo(bookie_id=REMOTE, host="10.0.0.5", port=3181, admin_url=url)
    view, keys = await keys_over(meta, info)
    try:
        with capture_logs() as logs:
            for ledger_id in (7, 8):
                with pytest.raises(ReplicationError):
                    await keys.master_key(ledger(ledger_id, REMOTE))
    finally:
        await keys.close()
        await view.close()
    warnings: list[MutableMapping[str, Any]] = [
        e for e in logs if e["event"] == "bookie_admin_url_on_loopback"
    ]
    assert len(warnings) == 1, logs
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["bookie_id"] == REMOTE and warnings[0]["admin_url"] == url
    assert "admin.host" in warnings[0]["hint"]
