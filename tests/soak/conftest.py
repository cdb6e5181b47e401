"""Long soaks: collected by every pytest run, run only with BKAIO_SOAK=1 (`make soak`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    if os.environ.get("BKAIO_SOAK") == "1":
        return
    skip = pytest.mark.skip(reason="a soak: only with BKAIO_SOAK=1 (make soak)")
    for item in items:
        if item.get_closest_marker("soak") and HERE in Path(item.path).parents:
            item.add_marker(skip)
