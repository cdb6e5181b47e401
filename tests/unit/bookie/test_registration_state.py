"""What a bookie shows of its registration: "registered" only while the store confirmed the
lease within its TTL; "unconfirmed" while the lease is in doubt (an event-loop stall or a late
refresh past the TTL, the store not asked again yet), when the gauge bkaio_bookie_registered is
0 and bkaio_bookie_registration_unconfirmed 1 but is_ready still answers 200 (the bookie serves
its clients as before); "lost" (is_ready 503) once the store dropped the lease and the
registration is not back; "none" before it registered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bkaio.bookie.admin import build_admin_app
from bkaio.bookie.parent import BookieParent
from bkaio.config import load_bookie_config
from bkaio.errors import MetadataError
from bkaio.meta.bookies import BookieInfo, BookieRegistration
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.store import KeyValue, Lease, MetadataStore, PrefixSnapshot, WatchEvent

TTL = 30.0  # Long: a lease the test does not put in doubt stays confirmed throughout.
LIVENESS = 10.0  # Bounds waits only.


class FakeLease(Lease):
    """A lease whose refreshes the store confirms until `expired` is set."""

    def __init__(self, *, requested_at: float) -> None:
        super().__init__(lease_id=5, ttl_seconds=TTL, requested_at=requested_at)
        self.expired = False

    async def keep_alive(self) -> None:
        if self.expired:
            raise LeaseExpiredError("lease 5 expired or was revoked (fake)")

    async def _revoke(self) -> None:
        pass


class FakeUnreachableStore(MetadataStore):
    """A metadata store that cannot be reached: a lost registration stays lost."""

    uri = "fake://unreachable"

    def _refuse(self) -> MetadataError:
        return MetadataError("metadata store unreachable (fake)")

    async def get(self, key: str) -> KeyValue | None:
        raise self._refuse()

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        raise self._refuse()

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        raise self._refuse()

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        raise self._refuse()

    async def list_prefix(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> list[KeyValue]:
        raise self._refuse()

    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        raise self._refuse()

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        raise self._refuse()

    async def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        raise self._refuse()
        yield  # An async generator, as the interface's.

    async def current_revision(self) -> int:
        raise self._refuse()

    async def close(self) -> None:
        pass


def _parent(tmp_path: Path) -> BookieParent:
    path = tmp_path / "bookie.toml"
    path.write_text(
        '[bookie]\nport = 3999\nhost = "127.0.0.1"\nshards = 1\n'
        f'[metadata]\nuri = "sqlite://{tmp_path / "meta.db"}"\n'
        f'[storage]\njournal_dirs = ["{tmp_path / "j"}"]\nledger_dirs = ["{tmp_path / "l"}"]\n'
    )
    parent = BookieParent(load_bookie_config(path, env={}))
    parent.running = True  # Its shards serve (none are started here).
    return parent


async def _shown(parent: BookieParent, http: TestClient[Any, Any]) -> dict[str, Any]:
    """What the admin state, is_ready and the two registration gauges say."""
    state = await (await http.get("/status")).json()
    ready = await http.get("/api/v1/bookie/is_ready")
    gauges = parent.metrics_registry
    return {
        "registration": state.get("registration"),
        "registered": state["registered"],
        "ready": ready.status,
        "gauge": gauges.get_sample_value("bkaio_bookie_registered"),
        "unconfirmed_gauge": gauges.get_sample_value("bkaio_bookie_registration_unconfirmed"),
    }


async def test_a_registration_whose_lease_is_in_doubt_is_shown_unconfirmed(
    tmp_path: Path,
) -> None:
    parent = _parent(tmp_path)
    loop = asyncio.get_running_loop()
    async with TestClient(TestServer(build_admin_app(parent))) as http:
        assert await _shown(parent, http) == {
            "registration": "none", "registered": False, "ready": 503,
            "gauge": 0.0, "unconfirmed_gauge": 0.0,
        }  # fmt: skip

        # No refresh confirmed for longer than the TTL (the loop stalled, say) and the
        # keep-alive not yet come round to ask the store again.
        lease = FakeLease(requested_at=loop.time() - 2 * TTL)
        info = BookieInfo(bookie_id="127.0.0.1:3999", host="127.0.0.1", port=3999)
        registration = BookieRegistration(FakeUnreachableStore(), info, lease)
        parent.registration = registration
        assert registration.registered and lease.in_doubt and not lease.lost
        assert await _shown(parent, http) == {
            "registration": "unconfirmed", "registered": False, "ready": 200,
            "gauge": 0.0, "unconfirmed_gauge": 1.0,
        }  # fmt: skip

        # The store confirms the lease.
        lease.start_keep_alive(interval_seconds=0.01)
        assert await asyncio.wait_for(lease.wait_confirmed(), LIVENESS)
        assert await _shown(parent, http) == {
            "registration": "registered", "registered": True, "ready": 200,
            "gauge": 1.0, "unconfirmed_gauge": 0.0,
        }  # fmt: skip

        # The store drops it, and cannot be reached to register again.
        lease.expired = True
        await asyncio.wait_for(lease.wait_lost(), LIVENESS)
        assert await _shown(parent, http) == {
            "registration": "lost", "registered": False, "ready": 503,
            "gauge": 0.0, "unconfirmed_gauge": 0.0,
        }  # fmt: skip
        await registration.deregister()
    await parent.supervisor.stop()
