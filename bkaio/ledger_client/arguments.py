"""Checks of the arguments the ledger client's public calls take, shared by its handles.

Each returns the value when it is in its domain, else raises InvalidArgumentError naming the
argument, before anything is sent or assigned. Ids travel as signed 64-bit ints: a larger one
would make a frame the bookie cannot decode, which it answers by closing the connection and so
failing this client's other requests on it (adds of other ledgers included). A bool is no int
here: `True` as an entry id or a quorum size is a mistake, not 1.
"""

from __future__ import annotations

import sys

from bkaio.errors import InvalidArgumentError
from bkaio.meta.ledgers import check_ledger_id
from bkaio.protocol.codes import I64_MAX

__all__ = [
    "MAX_ENTRY_ID",
    "check_count",
    "check_entry_id",
    "check_ledger_id",
    "check_password",
    "check_timeout",
]

MAX_ENTRY_ID = I64_MAX
_MAX_FLOAT = sys.float_info.max


def check_entry_id(ledger_id: int, entry_id: object, name: str = "entry id") -> int:
    """`entry_id` when it is an int in [0, MAX_ENTRY_ID]."""
    if (
        isinstance(entry_id, int)
        and not isinstance(entry_id, bool)
        and 0 <= entry_id <= MAX_ENTRY_ID
    ):
        return entry_id
    raise InvalidArgumentError(
        f"ledger {ledger_id}: {name} must be an int in [0, 2**63 - 1], got {entry_id!r} "
        f"({type(entry_id).__name__})"
    )


def check_count(value: object, name: str) -> int:
    """`value` when it is an int >= 1 (a number of entries, a quorum size)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise InvalidArgumentError(f"{name}={value!r} must be an int >= 1")


def check_password(password: object) -> bytes:
    """`password` as bytes when it is bytes-like (a str is a mistake: which encoding?)."""
    if isinstance(password, bytes | bytearray | memoryview):
        return bytes(password)
    raise InvalidArgumentError(f"password must be bytes, got {type(password).__name__}")


def check_timeout(timeout: object, name: str = "timeout") -> float:
    """`timeout` when it is a finite number of seconds >= 0 (a NaN would never expire)."""
    # A NaN and inf fail the comparisons, and so does an int too large to add to a float.
    if (
        isinstance(timeout, int | float)
        and not isinstance(timeout, bool)
        and 0 <= timeout <= _MAX_FLOAT
    ):
        return timeout
    raise InvalidArgumentError(f"{name}={timeout!r} must be a finite number of seconds >= 0")
