"""The bkaio ledger client: quorum writes, fencing, recovery and reads of ledgers.

`BookKeeper.connect(uri)` gives a client; `create_ledger` a `LedgerHandle` (the one writer),
`open_ledger` a `ReadHandle`. See docs/client.md for the decisions behind the add, read and
recovery paths. Imports `bkaio.protocol` and `bkaio.meta`, never `journal` or `entrylog`.
"""

from __future__ import annotations

from bkaio.ledger_client.bookkeeper import BookKeeper, password_hash
from bkaio.ledger_client.errors import (
    InvalidArgumentError,
    LedgerRecoveryError,
    RequestRefusedError,
)
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.ledger_client.read_handle import ReadHandle
from bkaio.ledger_client.types import ClientConfig, Entry

__all__ = [
    "BookKeeper",
    "ClientConfig",
    "Entry",
    "InvalidArgumentError",
    "LedgerHandle",
    "LedgerRecoveryError",
    "ReadHandle",
    "RequestRefusedError",
    "password_hash",
]
