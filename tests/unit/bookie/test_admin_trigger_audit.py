"""PUT /api/v1/autorecovery/trigger_audit on any bookie asks the elected auditor through the
metadata, as `bkaio shell triggeraudit` does. It used to audit only when this bookie was the
auditor, and otherwise answered 200 {"triggered": false} having asked nobody."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from bkaio.bookie.admin import build_admin_app
from bkaio.bookie.admin_jobs import AdminJobs
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.meta import Metadata, open_metadata
from bkaio.meta.autorecovery import AUDIT_REQUEST_KEY

TOKEN = "admin-secret"
PATH = "/api/v1/autorecovery/trigger_audit"
AUDITOR = "10.0.0.9:3181"  # Some other bookie.


class NotTheAuditor:
    """An `AdminHost` that is not the elected auditor; only its metadata is used here."""

    def __init__(self, config: BookieConfig, metadata: Metadata) -> None:
        self.config = config
        self.metrics_registry = CollectorRegistry()
        self.jobs = AdminJobs()
        self._metadata = metadata

    @property
    def admin_metadata(self) -> Metadata | None:
        return self._metadata

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    async def info(self) -> dict[str, Any]:
        raise NotImplementedError

    async def refresh_metrics(self) -> None:
        raise NotImplementedError

    async def set_forced_read_only(self, value: bool) -> None:
        raise NotImplementedError

    async def run_gc(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def gc_details(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def ledger_key(self, ledger_id: int) -> str | None:
        raise NotImplementedError


@pytest.fixture
async def meta(sqlite_metadata_uri: str) -> AsyncIterator[Metadata]:
    metadata = await open_metadata(sqlite_metadata_uri)
    try:
        yield metadata
    finally:
        await metadata.close()


@pytest.fixture
async def client(tmp_path: Path, meta: Metadata) -> AsyncIterator[TestClient[Any, Any]]:
    config = build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 45181},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'unused.db'}"},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
            "admin": {"token": TOKEN},
        },
        env={},
    )
    app: web.Application = build_admin_app(NotTheAuditor(config, meta))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def trigger(client: TestClient[Any, Any]) -> tuple[int, Any]:
    response = await client.put(PATH, headers={"Authorization": f"Bearer {TOKEN}"})
    return response.status, await response.json()


async def test_any_bookie_asks_the_elected_auditor(
    client: TestClient[Any, Any], meta: Metadata
) -> None:
    lease = await meta.store.grant_lease(30)
    assert await meta.auditor.try_become_auditor(AUDITOR, lease)
    assert await meta.store.get(AUDIT_REQUEST_KEY) is None
    assert await trigger(client) == (200, {"requested": True, "auditor": AUDITOR})
    # What the auditor watches for (bkaio/autorecovery/auditor.py, "requested").
    asked = await meta.store.get(AUDIT_REQUEST_KEY)
    assert asked is not None
    assert await trigger(client) == (200, {"requested": True, "auditor": AUDITOR})
    again = await meta.store.get(AUDIT_REQUEST_KEY)
    assert again is not None and again.version > asked.version


async def test_no_auditor_or_no_metadata_is_a_503_that_says_so(
    client: TestClient[Any, Any], meta: Metadata
) -> None:
    status, body = await trigger(client)
    assert status == 503 and body["kind"] == "NoAuditor", body
    assert "no auditor is elected" in body["error"]
    await meta.close()  # What an unreachable store raises too: MetadataError.
    status, body = await trigger(client)
    assert status == 503 and body["kind"] == "MetadataError", body
    assert body["error"].startswith("audit not requested: ")
