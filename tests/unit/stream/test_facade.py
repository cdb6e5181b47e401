"""`bkaio.BookKeeper`, the facade applications hold: the ledger client with `namespace()` on top
(bkaio/client.py), so that the ledger client never imports the stream package."""

from __future__ import annotations

import bkaio
from bkaio.client import BookKeeper as Facade
from bkaio.ledger_client import BookKeeper as LedgerClient
from bkaio.stream import Namespace


def test_the_public_bookkeeper_is_the_facade_over_the_ledger_client() -> None:
    assert bkaio.BookKeeper is Facade
    assert issubclass(Facade, LedgerClient)
    assert not hasattr(LedgerClient, "namespace")  # Streams build on ledgers, not the reverse.


async def test_connect_gives_the_facade_and_its_namespaces_work(sqlite_metadata_uri: str) -> None:
    async with bkaio.BookKeeper.connect(sqlite_metadata_uri) as bk:
        assert type(bk) is Facade
        ns = await bk.namespace("tenant-a", create=True)
        assert isinstance(ns, Namespace)
        assert (await bk.namespace("tenant-a")).name == "tenant-a"
    opened = await Facade.connect(sqlite_metadata_uri)
    try:
        assert type(opened) is Facade
    finally:
        await opened.close()
