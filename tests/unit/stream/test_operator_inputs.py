"""Inputs an operator or a library user gets wrong (found by an operator walk-through): each is
refused with an error that says what is wrong, and nothing is lost. Fake bookies + SQLite."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.stream import (
    Namespace,
    NamespaceNotEmptyError,
    NamespaceNotFoundError,
    RetentionReport,
    apply_retention,
    delete_namespace,
    open_namespace,
    run_retention,
)
from tests.unit.stream.conftest import ClientFactory


async def test_a_namespace_not_empty_says_how_to_force_from_the_api_and_the_cli(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    with pytest.raises(NamespaceNotEmptyError) as raised:
        await delete_namespace(bk, "tenant")
    assert "force=True (the CLI's --force)" in str(raised.value)
    assert await ns.list_streams() == ["s"]  # Nothing removed.


async def _stream_over_its_retention(bk: BookKeeper) -> Namespace:
    """Namespace "tenant" whose stream "s" holds 10 sealed segments of 10 bytes each, over its
    retention_bytes=20."""
    ns = await open_namespace(bk, "tenant", create=True, retention_bytes=20)
    writer = await ns.open_writer("s", roll_bytes=10)
    await asyncio.gather(*(writer.write(b"r" * 10) for _ in range(10)))
    await writer.close()
    return ns


async def test_retention_of_an_unknown_namespace_is_namespace_not_found(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await _stream_over_its_retention(bk)
    before = await ns.stream_metadata("s")
    for names in (["nope"], ["tenant", "nope"]):
        with pytest.raises(NamespaceNotFoundError, match="nope"):
            await apply_retention(bk, names)
    assert await ns.stream_metadata("s") == before  # Refused before any namespace is touched.
    [report] = await apply_retention(bk)  # All namespaces: the one that exists.
    assert report.namespace == "tenant" and report.removed["s"]


async def test_a_retention_loop_goes_on_past_a_namespace_that_is_gone(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    await _stream_over_its_retention(bk)
    reports: asyncio.Queue[RetentionReport] = asyncio.Queue()
    loop = asyncio.create_task(
        run_retention(
            bk, interval_seconds=3600, namespaces=["gone", "tenant"], on_report=reports.put
        )
    )
    try:
        report = await asyncio.wait_for(reports.get(), 30)  # Guards a hang, times nothing.
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    assert report.namespace == "tenant" and report.removed["s"]
