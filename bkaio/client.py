"""`bkaio.BookKeeper`: the object applications hold, ledgers and streams in one.

The ledger client (`bkaio.ledger_client.BookKeeper`) knows nothing of streams, and the stream
package builds on it; this facade sits above both and adds `namespace()`, so that neither
imports the other. `BookKeeper.connect` returns an instance of the class it is called on, so
`bkaio.BookKeeper.connect(uri)` gives this facade.
"""

from __future__ import annotations

from typing import Any

from bkaio.ledger_client.bookkeeper import BookKeeper as LedgerClient
from bkaio.stream import Namespace, open_namespace

__all__ = ["BookKeeper", "LedgerClient"]


class BookKeeper(LedgerClient):
    """A client of one bkaio cluster: the ledger client, plus namespaces of streams."""

    async def namespace(
        self,
        name: str,
        *,
        create: bool = False,
        quota_bytes: int | None = None,
        max_streams: int | None = None,
        **settings: Any,
    ) -> Namespace:
        """Open (or with create=True, create) a namespace of streams; see bkaio.stream."""
        return await open_namespace(
            self, name, create=create, quota_bytes=quota_bytes, max_streams=max_streams,
            **settings,
        )  # fmt: skip
