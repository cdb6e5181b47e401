"""bkaio: a replicated, durable, append-only log service in asyncio Python (after BookKeeper).

`bkaio.BookKeeper` is the client (API.md): the facade of bkaio/client.py, ledgers and streams.
It is imported lazily so that `import bkaio.protocol` in a bookie worker does not pay for the
client, the metadata drivers and gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bkaio.logs import configure_library_default

__version__ = "0.1.0"

configure_library_default()

if TYPE_CHECKING:
    from bkaio.client import BookKeeper
    from bkaio.ledger_client import Entry, LedgerHandle, ReadHandle

__all__ = ["BookKeeper", "Entry", "LedgerHandle", "ReadHandle", "__version__"]

_LAZY = frozenset({"BookKeeper", "Entry", "LedgerHandle", "ReadHandle"})


def __getattr__(name: str) -> Any:
    if name == "BookKeeper":
        from bkaio import client

        return client.BookKeeper
    if name in _LAZY:
        from bkaio import ledger_client

        return getattr(ledger_client, name)
    raise AttributeError(f"module 'bkaio' has no attribute {name!r}")
