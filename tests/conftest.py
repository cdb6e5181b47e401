"""Shared pytest configuration: fixtures in tests/fixtures are plugins so every suite sees them."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import structlog

from bkaio import localproc

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.bookies", "tests.fixtures.loop_errors"]


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ...
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or workers < 2:
        return
    # Ports for the servers tests start: each worker hands out ports from its own slice, so two
    # workers never pick the same port before either binds it.
    # A worker xdist starts in place of a crashed one (a test past its timeout ends its worker)
    # is numbered on from the last: it takes the window of the one it replaces.
    index = int(worker.removeprefix("gw")) % workers
    lowest, highest = localproc.port_limits()
    width = (highest - lowest) // workers
    low = lowest + index * width
    localproc.use_port_window(low, low + width)


@pytest.fixture(autouse=True)
def _restore_structlog_config() -> Iterator[None]:
    """A test that runs the CLI in-process reconfigures structlog (level, caching); undo it so
    later tests that capture log events still see them."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
