"""`bkaio shell` commands on running bookies.

    listbookies         registered bookies: state, rack, shards, free/total space, admin URL
    bookieinfo [ID]     free and total space of each bookie (or one), and of the cluster
    bookiesanity ID     write, read back and delete a ledger on that one bookie only

Space is the bookie's own figure (bkaio/bookie/space.py), asked over the wire protocol
(GET_BOOKIE_INFO), so these work from any host that can reach the bookies.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import click

from bkaio.cli.common import (
    client_options,
    client_tls_from_env,
    json_option,
    metadata_option,
    run,
    run_with_timeout,
)
from bkaio.cli.output import emit, table
from bkaio.cli.params import BOOKIE_ID, POSITIVE_SECONDS, TEST_ENTRIES
from bkaio.cli.scratch_ledger import check_read_back, scratch_ledger, scratch_payload
from bkaio.errors import BKError

PROBE_CONCURRENCY = 16


class SanityCheckError(BKError):
    """bookiesanity could not write, read back or delete its ledger on the bookie."""


class UnknownBookieError(BKError):
    """No registered bookie has this id."""


async def _registered(metadata_uri: str) -> list[Any]:
    from bkaio.meta import open_metadata

    meta = await open_metadata(metadata_uri)
    try:
        return sorted(await meta.bookies.list(), key=lambda b: b.bookie_id)
    finally:
        await meta.close()


async def _spaces(bookies: list[Any]) -> list[dict[str, Any]]:
    """Each bookie's space (or why it could not be asked), probed a few at a time."""
    from bkaio.bookie.probe import probe_bookie

    tls = client_tls_from_env()
    token = os.environ.get("BKAIO_AUTH_TOKEN") or None
    limit = asyncio.Semaphore(PROBE_CONCURRENCY)

    async def one(info: Any) -> dict[str, Any]:
        async with limit:
            try:
                space = await probe_bookie(info.host, info.port, tls=tls, auth_token=token)
            except (OSError, BKError, TimeoutError) as error:
                return {"free_bytes": None, "total_bytes": None, "error": str(error)}
        return {"free_bytes": space.free_bytes, "total_bytes": space.total_bytes}

    return list(await asyncio.gather(*(one(info) for info in bookies)))


@click.command("listbookies")
@metadata_option
@json_option
def list_bookies(metadata_uri: str, as_json: bool) -> None:
    """Writable and read-only bookies, with their free space."""

    async def go() -> list[dict[str, Any]]:
        bookies = await _registered(metadata_uri)
        spaces = await _spaces(bookies)
        return [
            {
                "bookie_id": info.bookie_id,
                "state": "read-only" if info.read_only else "writable",
                "rack": info.rack,
                "shards": info.shard_count,
                "admin_url": info.admin_url,
                "journal_sync": info.journal_sync,  # false: acks may not survive power loss.
                **space,
            }
            for info, space in zip(bookies, spaces, strict=True)
        ]

    rows = run(go())
    columns = [
        "bookie_id",
        "state",
        "journal_sync",
        "rack",
        "shards",
        "free_bytes",
        "total_bytes",
        "admin_url",
    ]
    emit(rows, as_json=as_json, human=table(rows, columns))


def _size(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{value} B"
        size /= 1024
    raise AssertionError("unreachable")


@click.command("bookieinfo")
@click.argument("bookie_id", type=BOOKIE_ID, required=False)
@metadata_option
@json_option
def bookie_info(bookie_id: str | None, metadata_uri: str, as_json: bool) -> None:
    """Free and total disk space of every bookie (or of BOOKIE_ID), and of the cluster."""

    async def go() -> dict[str, Any]:
        bookies = await _registered(metadata_uri)
        if bookie_id is not None:
            bookies = [b for b in bookies if b.bookie_id == bookie_id]
            if not bookies:
                raise UnknownBookieError(f"no registered bookie {bookie_id}")
        spaces = await _spaces(bookies)
        rows = [{"bookie_id": b.bookie_id, **s} for b, s in zip(bookies, spaces, strict=True)]
        reached = [r for r in rows if r["free_bytes"] is not None]
        return {
            "bookies": rows,
            "total_free_bytes": sum(r["free_bytes"] for r in reached),
            "total_bytes": sum(r["total_bytes"] for r in reached),
        }

    info = run(go())
    rows = [
        {**row, "free": _size(row["free_bytes"]), "total": _size(row["total_bytes"])}
        for row in info["bookies"]
    ]
    rows.append(
        {
            "bookie_id": "(cluster)",
            "free": _size(info["total_free_bytes"]),
            "total": _size(info["total_bytes"]),
        }
    )
    emit(info, as_json=as_json, human=table(rows, ["bookie_id", "free", "total", "error"]))


@click.command("bookiesanity")
@click.argument("bookie_id", type=BOOKIE_ID)
@click.option("--entries", default=10, show_default=True, type=TEST_ENTRIES)
@click.option(
    "--check-timeout",
    "timeout_seconds",
    default=30.0,
    show_default=True,
    type=POSITIVE_SECONDS,
    help="Seconds the whole check may take.",
)
@metadata_option
@json_option
def bookie_sanity(
    bookie_id: str, entries: int, timeout_seconds: float, metadata_uri: str, as_json: bool
) -> None:
    """Write ENTRIES to a new ledger on BOOKIE_ID alone (E=Qw=Qa=1), read them back, delete it."""
    report = run_with_timeout(_sanity(metadata_uri, bookie_id, entries), timeout_seconds)
    emit(
        report,
        as_json=as_json,
        human=f"bookiesanity passed: {bookie_id} wrote, read back and deleted "
        f"{entries} entries in ledger {report['ledger_id']}",
    )


async def _sanity(metadata_uri: str, bookie_id: str, entries: int) -> dict[str, Any]:
    from bkaio.ledger_client import BookKeeper

    password = b"bookiesanity"
    tag = f"bookiesanity {bookie_id}"
    async with BookKeeper.connect(
        metadata_uri, client_id="bkaio-bookiesanity", **client_options()
    ) as bk:
        target = next((b for b in bk.bookies if b.bookie_id == bookie_id), None)
        if target is None:
            raise UnknownBookieError(f"no registered bookie {bookie_id}")
        if target.read_only:
            raise SanityCheckError(f"bookie {bookie_id} is read-only: it takes no writes")
        # Placement chooses among the client's view: narrowed to this bookie, the new ledger's
        # ensemble can only be it. The check below catches a registry update in between.
        bk.set_bookies([target])
        handle = await bk.create_ledger(1, 1, 1, password=password)
        async with scratch_ledger(bk, handle):
            if handle.metadata is None or handle.metadata.ensembles[0][1] != (bookie_id,):
                raise SanityCheckError(f"the ledger was not placed on {bookie_id} alone")
            for index in range(entries):
                await handle.append(scratch_payload(tag, index))
            await handle.close()
            metadata = await bk.get_ledger_metadata(handle.ledger_id)
            others = {b for _, ensemble in metadata.ensembles for b in ensemble} - {bookie_id}
            if others:
                raise SanityCheckError(
                    f"{bookie_id} failed a write: the client moved the ledger to {sorted(others)}"
                )
            reader = await bk.open_ledger(handle.ledger_id, password=password, recovery=False)
            await check_read_back(reader, tag, entries, bookie_id)
    return {"bookie_id": bookie_id, "ledger_id": handle.ledger_id, "entries": entries, "ok": True}


COMMANDS = (list_bookies, bookie_info, bookie_sanity)
