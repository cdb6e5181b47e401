"""Shared pytest configuration: fixtures in tests/fixtures are plugins so every suite sees them."""

from __future__ import annotations

pytest_plugins = ["tests.fixtures.etcd", "tests.fixtures.bookies"]
