"""The client's connections to bookies: `BookieConnection` (bookie_connection.py), one per
bookie shard, and `BookiePool` (pool.py), the wire implementation of `BookieOps`. Re-exported
here, where the rest of the client and the tests have always imported them."""

from __future__ import annotations

from bkaio.ledger_client.bookie_connection import BookieConnection
from bkaio.ledger_client.connection_lifecycle import ADD_ENTRIES_FEATURE, BookieAddress
from bkaio.ledger_client.pool import BookiePool
from bkaio.ledger_client.requests_in_flight import ResponseCallback, Waiter

__all__ = [
    "ADD_ENTRIES_FEATURE",
    "BookieAddress",
    "BookieConnection",
    "BookiePool",
    "ResponseCallback",
    "Waiter",
]
