"""A request that names the bookie it is meant for (X-Bkaio-Bookie-Id) and reaches another
bookie's admin API is refused there: 409 WrongBookie naming both ids, nothing acted on, nothing
answered. With the default admin.host = 127.0.0.1 every bookie registered
http://127.0.0.1:<port>, so a process on another host that followed it reached whatever bookie
listened on that port on its own host, which read-only toggled, ran GC, or answered "no key
here" for a ledger it never held. Requests without the header (an operator's curl) still work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bkaio.bookie.admin import build_admin_app
from bkaio.security.admin_client import ADMIN_BOOKIE_HEADER
from tests.unit.bookie.fake_admin_host import FakeAdminHost, admin_config

TOKEN = "admin-secret"
THIS_BOOKIE = "127.0.0.1:45181"
OTHER_BOOKIE = "10.0.0.7:3181"


@pytest.fixture
def host(tmp_path: Path) -> FakeAdminHost:
    fake = FakeAdminHost(admin_config(tmp_path, "127.0.0.1", 45181, TOKEN))
    assert fake.config.bookie_id == THIS_BOOKIE
    return fake


@pytest.fixture
async def client(host: FakeAdminHost) -> AsyncIterator[TestClient[Any, Any]]:
    app: web.Application = build_admin_app(host)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def headers(bookie_id: str | None) -> dict[str, str]:
    sent = {"Authorization": f"Bearer {TOKEN}"}
    if bookie_id is not None:
        sent[ADMIN_BOOKIE_HEADER] = bookie_id
    return sent


async def test_a_request_for_another_bookie_is_refused_and_not_acted_on(
    client: TestClient[Any, Any], host: FakeAdminHost
) -> None:
    for method, path, body in (
        ("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
        ("PUT", "/api/v1/bookie/state", {"read_only": True}),
        ("PUT", "/api/v1/bookie/gc", None),
        ("GET", "/api/v1/autorecovery/ledger_key?ledger_id=7", None),
        ("GET", "/api/v1/bookie/info", None),
        ("GET", "/status", None),
    ):
        response = await client.request(method, path, json=body, headers=headers(OTHER_BOOKIE))
        answer = await response.json()
        assert response.status == 409, (path, answer)
        assert answer["kind"] == "WrongBookie"
        assert answer["bookie_id"] == THIS_BOOKIE
        assert answer["requested_bookie_id"] == OTHER_BOOKIE
        assert THIS_BOOKIE in answer["error"] and OTHER_BOOKIE in answer["error"]
    assert host.forced == [] and host.gc_runs == 0 and host.keys_asked == []


async def test_a_request_for_this_bookie_or_naming_none_is_served(
    client: TestClient[Any, Any], host: FakeAdminHost
) -> None:
    for named in (THIS_BOOKIE, None):
        response = await client.put(
            "/api/v1/bookie/state/readonly", json={"readOnly": True}, headers=headers(named)
        )
        assert response.status == 200, await response.text()
        response = await client.get(
            "/api/v1/autorecovery/ledger_key?ledger_id=7", headers=headers(named)
        )
        assert response.status == 200
        assert await response.json() == {"ledger_id": 7, "master_key": None}
    assert host.forced == [True, True] and host.keys_asked == [7, 7]
