"""Shared pytest configuration: fixtures from tests/fixtures are plugins so every suite sees them."""

from __future__ import annotations

pytest_plugins: list[str] = []
