"""Fault scenarios (reference/faults.md B2). The CI subset runs in `make test`; scenarios marked
`soak` run only with BKAIO_SOAK=1 (`make soak`, scripts/soak.py). Every scenario prints its
seed: rerun one with BKAIO_SEED=<seed>."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.harness.cluster import FaultCluster
from tests.faults.harness.nemesis import seed_from_env
from tests.fixtures.etcd import EtcdServer

HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "soak: long fault scenario, only with BKAIO_SOAK=1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("BKAIO_SOAK") == "1":
        return
    skipped = [i for i in items if i.get_closest_marker("soak") and HERE in Path(i.path).parents]
    if skipped:
        config.hook.pytest_deselected(items=skipped)
        items[:] = [i for i in items if i not in skipped]


@pytest.fixture
def seed() -> int:
    value = seed_from_env()
    print(f"BKAIO_SEED={value}")
    return value


ClusterFactory = Callable[..., Awaitable[FaultCluster]]


@pytest.fixture
async def make_cluster(
    tmp_path: Path, etcd_server: EtcdServer, seed: int
) -> AsyncIterator[ClusterFactory]:
    clusters: list[FaultCluster] = []

    async def make(
        bookies: int = 3, *, metadata_uri: str | None = None, **options: Any
    ) -> FaultCluster:
        base = tmp_path / f"cluster-{len(clusters)}"
        base.mkdir()
        cluster = FaultCluster(
            base, metadata_uri or etcd_server.uri, bookies=bookies, seed=seed, **options
        )
        clusters.append(cluster)
        await cluster.__aenter__()
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            await cluster.close()
