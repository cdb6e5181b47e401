"""`bkaio shell ...`: admin commands against any cluster, through the client and metadata APIs.

This module holds the group, the ledger commands (listledgers, ledgermetadata, readledger,
deleteledger, simpletest) and the autorecovery ones; cluster commands are in shell_cluster.py,
commands on running bookies in shell_bookies.py. docs/operations.md maps every BookKeeper shell
command to its bkaio one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import statistics
import time
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any, Protocol

import click
from rich.progress import Progress

from bkaio.cli import shell_bookies, shell_cluster
from bkaio.cli.common import client_options, json_option, metadata_option, run
from bkaio.cli.output import emit, payload_text, write_and_flush
from bkaio.cli.params import ENTRY_ID, LEDGER_ID, POSITIVE_INT, TEST_ENTRIES, check_range
from bkaio.cli.scratch_ledger import check_read_back, scratch_ledger, scratch_payload
from bkaio.cli.shell_autorecovery import add_autorecovery_commands
from bkaio.display import ledger_metadata_dict
from bkaio.errors import BKError, UnauthorizedError

PASSWORD_HELP = "Ledger password (default: empty)."
PROGRESS_THRESHOLD = 1000  # Below this many entries a progress bar is only noise.
PRINT_BATCH_ENTRIES = 1000  # Entries `readledger` prints in one write at most.
# "-1" reaches the id's range check ("-1 is not in the range x>=0") instead of being taken
# for an unknown option.
NEGATIVE_NUMBERS_AS_ARGUMENTS = {"ignore_unknown_options": True}


def _client(metadata_uri: str) -> Any:
    from bkaio.ledger_client import BookKeeper

    return BookKeeper.connect(metadata_uri, client_id="bkaio-shell", **client_options())


def _plain(value: Any) -> Any:
    """Metadata objects as plain data for printing."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


@click.group()
def shell() -> None:
    """Admin commands: the cluster, its bookies and ledgers, autorecovery, self-tests."""


for _command in (*shell_cluster.COMMANDS, *shell_bookies.COMMANDS):
    shell.add_command(_command)


@shell.command("listledgers")
@metadata_option
@json_option
def list_ledgers(metadata_uri: str, as_json: bool) -> None:
    """Every ledger id in the metadata store."""

    async def go() -> list[int]:
        async with _client(metadata_uri) as bk:
            return [ledger_id async for ledger_id in bk.list_ledgers()]

    ids = run(go())
    emit(ids, as_json=as_json, human="\n".join(map(str, ids)) if ids else "(no ledgers)")


@shell.command("ledgermetadata", context_settings=NEGATIVE_NUMBERS_AS_ARGUMENTS)
@click.argument("ledger_id", type=LEDGER_ID)
@metadata_option
@json_option
def ledger_metadata(ledger_id: int, metadata_uri: str, as_json: bool) -> None:
    """The metadata of one ledger: quorums, state, ensembles."""

    async def go() -> dict[str, Any]:
        async with _client(metadata_uri) as bk:
            return ledger_metadata_dict(await bk.get_ledger_metadata(ledger_id))

    emit(run(go()), as_json=as_json)


@shell.command("readledger", context_settings=NEGATIVE_NUMBERS_AS_ARGUMENTS)
@click.argument("ledger_id", type=LEDGER_ID)
@click.argument("first", type=ENTRY_ID, required=False)
@click.argument("last", type=ENTRY_ID, required=False)
@click.option("--password", default="", help=PASSWORD_HELP)
@metadata_option
@json_option
def read_ledger(
    ledger_id: int,
    first: int | None,
    last: int | None,
    password: str,
    metadata_uri: str,
    as_json: bool,
) -> None:
    """Entries FIRST..LAST (inclusive; default all), unfenced: UTF-8 when printable, else hex."""
    check_range(first, last)

    async def go() -> None:
        async with _client(metadata_uri) as bk:
            try:
                handle = await bk.open_ledger(ledger_id, password=password.encode(), recovery=False)
            except UnauthorizedError as error:
                if password:
                    raise
                # Forgetting --password is likelier than a ledger whose password is empty.
                raise UnauthorizedError(f"{error}: none given; pass --password") from error
            end = (
                handle.last_entry_id if handle.is_closed else await handle.read_last_add_confirmed()
            )
            start = 0 if first is None else first
            stop = end if last is None else last
            # Closed here when printing stops early (`| head`), not by the loop's shutdown
            # while it is still reading ahead.
            entries: AsyncGenerator[ShownEntry, None] = (
                handle.read_iter(start, stop) if start <= stop else _no_entries()
            )
            async with contextlib.aclosing(entries):
                await print_entries(entries, as_json=as_json)

    run(go())


async def _no_entries() -> AsyncGenerator[ShownEntry, None]:  # An open ledger before its first.
    none: tuple[ShownEntry, ...] = ()
    for entry in none:
        yield entry


class ShownEntry(Protocol):
    @property
    def entry_id(self) -> int: ...

    @property
    def payload(self) -> bytes: ...


async def print_entries(entries: AsyncIterable[ShownEntry], *, as_json: bool) -> int:
    """Print entries as they come, PRINT_BATCH_ENTRIES lines per write (off the event loop):
    memory holds a batch, not the ledger (a whole ledger is `readledger`'s default). The same
    text as one document would be: `ID<TAB>payload` lines or "(no entries)"; with `as_json` one
    JSON list. A read failing part-way leaves the entries before it printed. The count."""
    count, pending = 0, []
    try:
        async for entry in entries:
            shown = payload_text(entry.payload)
            if as_json:
                row = json.dumps({"entry_id": entry.entry_id, "payload": shown}, sort_keys=True)
                pending.append(("[" if count == 0 else ", ") + row)
            else:
                pending.append(f"{entry.entry_id}\t{shown}\n")
            count += 1
            if len(pending) >= PRINT_BATCH_ENTRIES:
                await asyncio.to_thread(write_and_flush, "".join(pending))
                pending.clear()
    except BKError:
        await asyncio.to_thread(write_and_flush, "".join(pending))  # What was read, shown.
        raise
    if as_json:
        pending.append("]\n" if count else "[]\n")
    elif not count:
        pending.append("(no entries)\n")
    await asyncio.to_thread(write_and_flush, "".join(pending))
    return count


@shell.command("deleteledger", context_settings=NEGATIVE_NUMBERS_AS_ARGUMENTS)
@click.argument("ledger_id", type=LEDGER_ID)
@click.option("--force", is_flag=True, help="Delete it even if a stream names it as a segment.")
@metadata_option
@json_option
def delete_ledger(ledger_id: int, force: bool, metadata_uri: str, as_json: bool) -> None:
    """Delete a ledger from the metadata; bookies reclaim its space in garbage collection.

    A segment of a stream is refused without --force: its records would be lost and the stream
    unreadable from them on (`bkaio stream truncate` or `delete` remove segments whole)."""

    async def go() -> None:
        async with _client(metadata_uri) as bk:
            if not force:
                from bkaio.stream.ledger_owner import refuse_a_stream_segment
                from bkaio.stream.store import metadata_of

                await refuse_a_stream_segment(metadata_of(bk), ledger_id, override="--force")
            await bk.delete_ledger(ledger_id)

    run(go())
    emit({"deleted": ledger_id}, as_json=as_json, human=f"deleted ledger {ledger_id}")


@shell.command("simpletest")
@click.option("--entries", default=100, show_default=True, type=TEST_ENTRIES)
@click.option("--ensemble-size", "-e", default=None, type=POSITIVE_INT)
@click.option("--write-quorum", "-w", default=None, type=POSITIVE_INT)
@click.option("--ack-quorum", "-a", default=None, type=POSITIVE_INT)
@metadata_option
@json_option
def simple_test(
    entries: int,
    ensemble_size: int | None,
    write_quorum: int | None,
    ack_quorum: int | None,
    metadata_uri: str,
    as_json: bool,
) -> None:
    """Create a ledger, append ENTRIES, read them back, verify, delete; report latency.

    Whatever fails half-way, the ledger it made is closed and deleted."""
    e, w, a = ensemble_size, write_quorum, ack_quorum
    if (e is not None and w is not None and w > e) or (a is not None and w is not None and a > w):
        raise click.BadParameter("need ensemble size >= write quorum >= ack quorum")
    report = run(
        _simple_test(metadata_uri, entries, ensemble_size, write_quorum, ack_quorum, as_json)
    )
    human = (
        f"simpletest passed: ledger {report['ledger_id']} on {report['ensemble']}, "
        f"{report['entries']} entries written and read back; append latency "
        f"p50 {report['append_p50_ms']} ms, p99 {report['append_p99_ms']} ms"
    )
    emit(report, as_json=as_json, human=human)


async def _simple_test(
    metadata_uri: str,
    entries: int,
    ensemble_size: int | None,
    write_quorum: int | None,
    ack_quorum: int | None,
    as_json: bool,
) -> dict[str, Any]:
    from bkaio.meta import open_metadata

    meta = await open_metadata(metadata_uri)
    try:
        writable = sum(1 for info in await meta.bookies.list() if not info.read_only)
    finally:
        await meta.close()
    ensemble = ensemble_size or max(min(3, writable), write_quorum or 1, ack_quorum or 1)
    write = write_quorum or ensemble
    ack = ack_quorum or min(2, write)
    password = b"simpletest"
    async with _client(metadata_uri) as bk:
        handle = await bk.create_ledger(
            ensemble_size=ensemble, write_quorum=write, ack_quorum=ack, password=password
        )
        latencies_ms: list[float] = []
        async with scratch_ledger(bk, handle):
            with Progress(disable=as_json or entries < PROGRESS_THRESHOLD, transient=True) as bar:
                task = bar.add_task("appending", total=entries)
                for index in range(entries):  # One at a time: this measures latency.
                    started = time.perf_counter()
                    await handle.append(scratch_payload("simpletest", index))
                    latencies_ms.append((time.perf_counter() - started) * 1000)
                    bar.advance(task)
            ensemble_ids = list(handle.metadata.ensembles[0][1]) if handle.metadata else []
            await handle.close()
            reader = await bk.open_ledger(handle.ledger_id, password=password, recovery=False)
            await check_read_back(reader, "simpletest", entries, f"ledger {handle.ledger_id}")
    ordered = sorted(latencies_ms)
    return {
        "ledger_id": handle.ledger_id,
        "ensemble": ensemble_ids,
        "entries": entries,
        "quorums": [ensemble, write, ack],
        "append_p50_ms": round(statistics.median(ordered), 3),
        "append_p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "append_max_ms": round(ordered[-1], 3),
    }


add_autorecovery_commands(shell)  # recover, decommission, ... (shell_autorecovery.py)
