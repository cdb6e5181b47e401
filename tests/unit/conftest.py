"""Every async unit test runs under both the stock asyncio loop and uvloop (STYLE.md section 8)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

from tests.fixtures.loop_errors import recording


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    del config, item
    # Both record what reaches their exception handler (tests/fixtures/loop_errors.py).
    return {
        "asyncio": recording(asyncio.new_event_loop),
        "uvloop": recording(uvloop.new_event_loop),
    }
