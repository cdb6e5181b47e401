"""Every error the bookie admin API answers is JSON `{"error": ..., "kind": ...}`, as
docs/operations.md says: an unknown path answered aiohttp's plain-text `404: Not Found`, a
method the path does not take `405: Method Not Allowed`, a body over the size limit and a
handler's unexpected exception plain text too (the exception only in aiohttp's own log)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bkaio.bookie.admin import build_admin_app
from tests.unit.bookie.fake_admin_host import FakeAdminHost, admin_config

TOKEN = "admin-secret"
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


class FailingInfoHost(FakeAdminHost):
    """A host whose `info` fails in a way no handler expects."""

    async def info(self) -> dict[str, Any]:
        raise RuntimeError("disk table vanished")


@pytest.fixture
def host(tmp_path: Path) -> FailingInfoHost:
    return FailingInfoHost(admin_config(tmp_path, "127.0.0.1", 45181, TOKEN))


@pytest.fixture
async def client(host: FailingInfoHost) -> AsyncIterator[TestClient[Any, Any]]:
    app: web.Application = build_admin_app(host)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def json_answer(response: Any) -> dict[str, Any]:
    assert response.content_type == "application/json", await response.text()
    answer: dict[str, Any] = await response.json()
    assert set(answer) >= {"error", "kind"}, answer
    return answer


async def test_an_unknown_path_is_a_json_404(client: TestClient[Any, Any]) -> None:
    for method, path in (
        ("GET", "/api/v1/nope"),
        ("DELETE", "/api/v1/ledger/remove"),
        ("GET", "/"),
    ):
        response = await client.request(method, path, headers=AUTHORIZED)
        assert response.status == 404, path
        answer = await json_answer(response)
        assert answer["kind"] == "NotFound"
        assert path in answer["error"], answer


async def test_a_wrong_method_is_a_json_405_with_allow(client: TestClient[Any, Any]) -> None:
    for method, path, allowed in (
        ("POST", "/api/v1/ledger/list", "GET"),
        ("GET", "/api/v1/ledger/delete", "DELETE"),
        ("DELETE", "/api/v1/bookie/gc", "GET"),
    ):
        response = await client.request(method, path, headers=AUTHORIZED)
        assert response.status == 405, path
        answer = await json_answer(response)
        assert answer["kind"] == "MethodNotAllowed"
        assert method in answer["error"] and path in answer["error"], answer
        assert allowed in response.headers["Allow"].split(","), response.headers


async def test_a_body_too_large_is_a_json_413(
    client: TestClient[Any, Any], host: FailingInfoHost
) -> None:
    response = await client.put(
        "/api/v1/bookie/state/readonly",
        data=b'{"readOnly": true, "pad": "' + b"x" * 100_000 + b'"}',
        headers={**AUTHORIZED, "Content-Type": "application/json"},
    )
    assert response.status == 413
    answer = await json_answer(response)
    assert answer["kind"] == "RequestEntityTooLarge"
    assert "65536" in answer["error"], answer
    assert host.forced == []


async def test_an_unexpected_failure_is_a_json_500_logged_and_counted(
    client: TestClient[Any, Any], host: FailingInfoHost
) -> None:
    def failures() -> float | None:
        return host.metrics_registry.get_sample_value(
            "bkaio_task_failures_total", {"task": "admin_http"}
        )

    response = await client.get("/api/v1/bookie/info")
    assert response.status == 500
    answer = await json_answer(response)
    assert answer["kind"] == "InternalError"
    assert "disk table vanished" in answer["error"], answer
    assert failures() == 1.0
    response = await client.get("/api/v1/bookie/state")  # The app serves on.
    assert response.status == 200
