"""A fake of the bookie parent as its admin HTTP sees it (`AdminHost`), for tests that serve
the real admin app (bkaio.bookie.admin.build_admin_app) without a bookie."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bkaio.bookie.admin_jobs import AdminJobs
from bkaio.config import BookieConfig, build_bookie_config
from bkaio.meta import Metadata


def admin_config(
    tmp_path: Path, host: str, port: int, token: str, admin_port: int = 8180
) -> BookieConfig:
    """A bookie configuration with id `host:port`, admin token `token` and its admin API on
    127.0.0.1:`admin_port` (nothing is made)."""
    return build_bookie_config(
        {
            "bookie": {"host": host, "port": port},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'unused.db'}"},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
            "admin": {"token": token, "port": admin_port},
        },
        env={},
    )


class FakeAdminHost:
    """An `AdminHost` that records what it was asked to do."""

    def __init__(self, config: BookieConfig) -> None:
        self.config = config
        self.metrics_registry = CollectorRegistry()
        self.jobs = AdminJobs()
        self.forced: list[bool] = []
        self.keys_asked: list[int] = []
        self.keys: dict[int, str] = {}  # Hex master keys this bookie recorded, by ledger id.
        self.gc_runs = 0

    @property
    def admin_metadata(self) -> Metadata | None:
        return None

    def state(self) -> dict[str, Any]:
        return {
            "bookie_id": self.config.bookie_id,
            "running": True,
            "read_only": bool(self.forced and self.forced[-1]),
            "shutting_down": False,
            "registration": "registered",
            "registered": True,
            "healthy": True,
            "unhealthy_reason": None,
        }

    async def info(self) -> dict[str, Any]:
        return self.state()

    async def refresh_metrics(self) -> None:
        pass

    async def set_forced_read_only(self, value: bool) -> None:
        self.forced.append(value)

    async def run_gc(self) -> list[dict[str, Any]]:
        self.gc_runs += 1
        return []

    async def gc_details(self) -> list[dict[str, Any]]:
        return []

    async def ledger_key(self, ledger_id: int) -> str | None:
        self.keys_asked.append(ledger_id)
        return self.keys.get(ledger_id)
