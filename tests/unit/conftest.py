"""Every async unit test runs under both the stock asyncio loop and uvloop (STYLE.md section 8)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import uvloop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    del config, item
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return factories
