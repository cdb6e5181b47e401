from __future__ import annotations

import pytest

from bkaio.config import build_bookie_config
from bkaio.errors import ConfigError


def test_autorecovery_and_gc_sections_parse_with_env_overrides() -> None:
    config = build_bookie_config(
        {
            "autorecovery": {"lost_bookie_delay_seconds": 0, "worker_concurrency": 4},
            "gc": {"interval_seconds": 5},
        },
        {"BKAIO_GC_GRACE_SECONDS": "1.5", "BKAIO_AUTORECOVERY_ENABLED": "false"},
    )
    assert config.autorecovery.lost_bookie_delay_seconds == 0.0
    assert config.autorecovery.worker_concurrency == 4
    assert config.autorecovery.enabled is False
    assert config.gc.interval_seconds == 5.0 and config.gc.grace_seconds == 1.5


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("autorecovery", "lost_bookie_delay_seconds", -1.0, "must be >= 0"),
        ("autorecovery", "worker_concurrency", 0, "must be in"),
        ("gc", "interval_seconds", 0.0, "must be > 0"),
        ("gc", "colour", 1, "unknown key gc.colour"),
    ],
)
def test_bad_values_name_the_key(section: str, key: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_bookie_config({section: {key: value}}, {})
