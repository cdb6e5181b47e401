"""ClientConfig refuses a value of the wrong type or out of range with a ConfigError naming
the field: every field's type is checked against its annotation first (a bool is no int, a
float field takes an int but no NaN or inf), then the range rules, which a NaN cannot pass.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from bkaio.errors import ConfigError
from bkaio.ledger_client.types import ClientConfig
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES

NAN = math.nan


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # A NaN passed every "x <= 0" / "x < 1" check: speculative_read_timeout=nan made read()
        # fail under uvloop, max_queued_adds=nan removed the bound on queued appends.
        ("explicit_lac_interval", NAN),
        ("speculative_read_timeout", NAN),
        ("max_outstanding_adds", NAN),
        ("max_queued_adds", NAN),
        ("read_window", NAN),
        ("read_batch_entries", NAN),
        ("read_batch_bytes", NAN),
        ("read_ahead_requests", NAN),
        ("read_ahead_bytes", NAN),
        ("tail_backoff_min", NAN),
        ("tail_backoff_max", NAN),
        ("add_timeout", math.inf),
        ("read_ahead_entries_per_second", math.inf),
        ("add_timeout", 10**400),  # An int no float holds: failed only when first used.
        # max_frame_bytes was not checked at all.
        ("max_frame_bytes", 0),
        ("max_frame_bytes", -1),
        ("max_frame_bytes", NAN),
        ("max_frame_bytes", "8"),
        ("max_frame_bytes", FRAME_ENVELOPE_BYTES),  # No room for an entry.
        # Nor were the types.
        ("client_id", 3),
        ("auth_token", b"token"),
        ("placement", None),
        ("explicit_lac_on_ack", 1),
        ("sticky_reads", "yes"),
        ("max_outstanding_adds", 2.5),
        ("read_window", True),
        ("add_batch_wait_us", 10.0),
        ("add_timeout", "5"),
        ("connect_timeout", False),
    ],
)
def test_a_bad_value_is_a_config_error_naming_its_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}="):
        ClientConfig(**{field: value})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tail_backoff_min": 2.0}, r"tail_backoff_min=2\.0 must be in \(0, tail_backoff_max="),
        ({"tail_backoff_min": 0}, r"tail_backoff_min=0 must be in \(0,"),
        ({"max_queued_adds": 0}, "max_queued_adds=0 must be >= 1"),
        ({"explicit_lac_interval": -0.1}, r"explicit_lac_interval=-0\.1 must be >= 0"),
        ({"max_frame_bytes": 4096}, "max_frame_bytes=4096 must be > 4096"),
    ],
)
def test_range_rules_after_the_types(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClientConfig(**options)


def test_good_values_pass_and_the_entry_limit_follows_the_frame_limit() -> None:
    """An int where a float is declared (whole seconds), None where it is optional."""
    config = ClientConfig(
        add_timeout=1,
        speculative_read_timeout=None,
        auth_token=None,
        explicit_lac_interval=0,
        max_frame_bytes=FRAME_ENVELOPE_BYTES + 1,
    )
    assert config.max_entry_bytes == 1
    assert ClientConfig().max_entry_bytes == 8 * 1024 * 1024 - FRAME_ENVELOPE_BYTES
