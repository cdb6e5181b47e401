"""Shared pytest configuration: fixtures in tests/fixtures are plugins so every suite sees them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.bookies", "tests.fixtures.loop_errors"]


@pytest.fixture(autouse=True)
def _restore_structlog_config() -> Iterator[None]:
    """A test that runs the CLI in-process reconfigures structlog (level, caching); undo it so
    later tests that capture log events still see them."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
