"""`bkaio stream ...`: namespaces and streams from the command line.

    bkaio stream create NS [--quota-bytes N ...]      bkaio stream create NS/STREAM
    bkaio stream list [NS]                            bkaio stream delete NS[/STREAM] [--force]
    bkaio stream write NS/STREAM [PAYLOAD ...]        (no PAYLOAD: one record per stdin line,
                                                       sent as it arrives; EOF closes)
    bkaio stream tail NS/STREAM [--from earliest|latest|LEDGER:ENTRY@SEQ|SEQ] [--cursor NAME]
    bkaio stream truncate NS/STREAM --before POSITION [--force]
    bkaio stream cursors NS/STREAM                    bkaio stream retain [NS ...] [--every S]
    bkaio stream info NS/STREAM                       (bkaio/cli/stream_info.py)
    bkaio stream orphans NS [--older-than S] [--delete]  (bkaio/cli/stream_orphans.py)

Positions print as LEDGER:ENTRY@SEQ. Every command takes --metadata (or $BKAIO_METADATA) and
--json; failures are one line on stderr (bkaio/cli/main.py). `write` and `tail` print one line
per record as it goes (with --json, one JSON object per line), so they work in pipes that
never end: `tail -f app.log | bkaio stream write NS/STREAM`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click
from click.core import ParameterSource

from bkaio.cli.common import json_option, metadata_option, run
from bkaio.cli.output import emit, payload_text, table, write_and_flush
from bkaio.cli.params import (
    POSITIVE_INT,
    POSITIVE_SECONDS,
    name_argument,
    split_stream_name,
    stream_position,
)

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper
    from bkaio.stream import Namespace, StreamPosition, StreamReader, StreamRecord, StreamWriter

T = TypeVar("T")

# Records `stream write` keeps in flight (sent, not yet acknowledged) by default.
DEFAULT_WRITE_WINDOW = 1000
# Lines `write` and `tail` print in one write at most (those at hand: acknowledged positions,
# records the reader has read ahead), so a fast stream is not printed one thread hop per line.
_PRINT_BATCH_LINES = 1000


@asynccontextmanager
async def connected(metadata_uri: str) -> AsyncIterator[BookKeeper]:
    from bkaio.ledger_client import BookKeeper

    async with BookKeeper.connect(metadata_uri, client_id="bkaio-stream-cli") as bk:
        yield bk


async def _namespace(bk: BookKeeper, name: str, **create: Any) -> Namespace:
    from bkaio.stream import open_namespace

    return await open_namespace(bk, name, **create)


def _parse_start(text: str) -> Literal["earliest", "latest"] | StreamPosition | int:
    from bkaio.stream import StreamPosition

    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    if text.isdigit():
        return int(text)
    return StreamPosition.parse(text)


async def _position_for_seq(namespace: Namespace, stream: str, seq: int) -> StreamPosition:
    """The position of record `seq` (StreamTruncatedError if it is gone). Past the end, the
    position one past the last segment (the reader judges it by its seq: the next seq is a good
    start, a later one is refused naming it), so the command and the API agree."""
    from bkaio.stream import StreamPosition
    from bkaio.stream.ends import truncated_error

    meta = await namespace.stream_metadata(stream)
    if seq < meta.first_seq:
        raise truncated_error(f"{namespace.name}/{stream}", seq, meta)
    if not meta.segments:
        return StreamPosition(0, 0, seq)  # No segment: the reader judges the seq alone.
    index = meta.segment_index_for(seq)
    segment = meta.segments[-1 if index is None else index]  # None: one past the last one.
    return StreamPosition(segment.ledger_id, seq - segment.first_seq, seq)


@click.group()
def stream() -> None:
    """Namespaces and streams: create, list, info, write, tail, truncate, delete, cursors,
    retain, orphans."""


@stream.command("create")
@click.argument("name")
@click.option("--quota-bytes", type=POSITIVE_INT, help="Namespace byte quota.")
@click.option("--max-streams", type=POSITIVE_INT, help="Namespace stream limit.")
@click.option("--retention-seconds", type=POSITIVE_SECONDS)
@click.option("--retention-bytes", type=POSITIVE_INT)
@click.option("--retention-ignores-cursors", is_flag=True, help="Retention may pass cursors.")
@click.option("--ensemble-size", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--write-quorum", type=POSITIVE_INT, default=2, show_default=True)
@click.option("--ack-quorum", type=POSITIVE_INT, default=2, show_default=True)
@click.option("--rack", "racks", multiple=True, help="Placement rack label (repeatable).")
@metadata_option
@json_option
def create(metadata_uri: str, as_json: bool, name: str, **options: Any) -> None:
    """Create namespace NS (with its settings), or stream NS/STREAM in an existing namespace."""
    namespace_name, stream_name = split_stream_name(name, stream_required=False)
    context = click.get_current_context()
    given = [p.opts[0] for p in context.command.params if p.name in options
             and context.get_parameter_source(p.name) is not ParameterSource.DEFAULT]  # fmt: skip
    if stream_name is not None and given:  # Taken in silence, they set nothing.
        raise click.UsageError(
            f"only a namespace takes {', '.join(given)}: give it when namespace "
            f"{namespace_name} is created; a stream has no settings of its own"
        )
    if (
        options["ack_quorum"] > options["write_quorum"]
        or options["write_quorum"] > options["ensemble_size"]
    ):
        raise click.BadParameter("need --ensemble-size >= --write-quorum >= --ack-quorum")

    async def go() -> dict[str, Any]:
        from bkaio.stream import create_namespace

        async with connected(metadata_uri) as bk:
            if stream_name is not None:
                namespace = await _namespace(bk, namespace_name)
                meta = await namespace.create_stream(stream_name)
                return {"stream": name, "epoch": meta.epoch, "segments": len(meta.segments)}
            racks = options.pop("racks")
            namespace = await create_namespace(
                bk, namespace_name, rack_labels=tuple(racks), **options
            )
            return {"namespace": namespace_name, **namespace.settings.to_dict()}

    emit(run(go()), as_json=as_json)


@stream.command("list")
@click.argument("namespace", required=False, callback=name_argument("namespace"))
@metadata_option
@json_option
def list_command(metadata_uri: str, as_json: bool, namespace: str | None) -> None:
    """List namespaces, or the streams of NAMESPACE with their size and end."""

    async def go() -> list[dict[str, Any]]:
        from bkaio.stream import list_namespaces

        async with connected(metadata_uri) as bk:
            if namespace is None:
                return [{"namespace": name} for name in await list_namespaces(bk)]
            ns = await _namespace(bk, namespace)
            rows = []
            for name in await ns.list_streams():
                meta = await ns.stream_metadata(name)
                open_segment = meta.open_segment
                rows.append(
                    {
                        "stream": name,
                        "epoch": meta.epoch,
                        "segments": len(meta.segments),
                        "first_seq": meta.first_seq,
                        "sealed_bytes": meta.sealed_bytes,
                        "writer": "open" if open_segment is not None else "-",
                    }
                )
            return rows

    rows = run(go())
    columns = ["namespace"] if namespace is None else list(rows[0]) if rows else ["stream"]
    emit(rows, as_json=as_json, human=table(rows, columns))


@stream.command("write")
@click.argument("name")
@click.argument("payloads", nargs=-1)
@click.option("--hex", "as_hex", is_flag=True, help="PAYLOADs (or stdin lines) are hex.")
@click.option(
    "--window",
    type=POSITIVE_INT,
    default=DEFAULT_WRITE_WINDOW,
    show_default=True,
    help="Records in flight at most (sent, not yet acknowledged).",
)
@metadata_option
@json_option
def write(
    metadata_uri: str,
    as_json: bool,
    name: str,
    payloads: tuple[str, ...],
    as_hex: bool,
    window: int,
) -> None:
    """Append PAYLOADs (default: each line of stdin, sent as it arrives) to NS/STREAM (created
    if it does not exist), becoming its writer; print each record's position once it is
    acknowledged. EOF flushes and closes."""
    namespace_name, stream_name = split_stream_name(name, stream_required=True)
    assert stream_name is not None

    async def go() -> None:
        async with connected(metadata_uri) as bk:
            namespace = await _namespace(bk, namespace_name)
            if payloads:
                records = _records(_given(payloads), as_hex)
            else:
                records = _records(_stdin_lines(bk.config.max_frame_bytes), as_hex)
            writer = await namespace.open_writer(stream_name)
            try:
                await _write_pipelined(writer, records, window, as_json)
            finally:
                await writer.close()  # Waits for every write sent (the flush), then seals.

    run(go())


async def _given(payloads: tuple[str, ...]) -> AsyncIterator[bytes]:
    for payload in payloads:
        yield payload.encode()


def _stdin_lines(max_line_bytes: int) -> AsyncIterator[bytes]:
    from bkaio.cli.stdin_lines import lines_of, stdin_input

    return lines_of(stdin_input(), max_line_bytes=max_line_bytes)


async def _records(lines: AsyncIterable[bytes], as_hex: bool) -> AsyncIterator[bytes]:
    """The records to write: the lines as they are, or decoded from hex. A line too long or
    not hex is a usage error (exit 2) once the records before it are written."""
    from bkaio.cli.stdin_lines import LineTooLongError

    number, written = 0, "the records before it were written"
    try:
        async for line in lines:
            number += 1
            try:
                yield bytes.fromhex(line.decode("ascii")) if as_hex else line
            except ValueError as error:  # UnicodeDecodeError included.
                raise click.BadParameter(
                    f"record {number} is not hex ({error}); {written}"
                ) from None
    except LineTooLongError as error:
        raise click.BadParameter(f"{error}; {written}") from None


async def _write_pipelined(
    writer: StreamWriter, records: AsyncIterator[bytes], window: int, as_json: bool
) -> None:
    """Send each record as it comes, with at most `window` unacknowledged; print positions in
    order as they are acknowledged, while waiting for more input too."""
    sent: asyncio.Queue[asyncio.Future[StreamPosition] | None] = asyncio.Queue()
    room = asyncio.Semaphore(window)

    async def show_in_order() -> None:
        lines: list[str] = []
        while (future := await sent.get()) is not None:
            position = await future  # A failed write ends the command with its error.
            if as_json:
                lines.append(json.dumps({"position": str(position), **position.to_dict()}))
            else:
                lines.append(str(position))
            room.release()
            # Printed once no acknowledgement is queued behind them (or a batch is full); while
            # stdout is slow this waits, and the window stops the sending.
            if sent.empty() or len(lines) >= _PRINT_BATCH_LINES:
                await _print_lines(lines)
                lines = []
        await _print_lines(lines)

    printer = asyncio.ensure_future(show_in_order())
    bad_input: Exception | None = None
    try:
        try:
            while (record := await _unless_failed(anext(records, None), printer)) is not None:
                await _unless_failed(room.acquire(), printer)
                # Past the handle's bound (or a roll's): wait, not TooManyRequestsError.
                await _unless_failed(writer.wait_for_capacity(), printer)
                future = writer.write(record)
                # A failed write fails the command through the printer; the others' errors
                # are the same failure and must not be reported as never retrieved.
                future.add_done_callback(_retrieved)
                sent.put_nowait(future)
        except Exception as error:
            if printer.done():
                raise  # A write failed.
            bad_input = error  # Raised once what was sent before it is acknowledged.
        sent.put_nowait(None)
        await printer
        if bad_input is not None:
            raise bad_input
    finally:
        if not printer.done():
            printer.cancel()
            await asyncio.gather(printer, return_exceptions=True)


async def _unless_failed(step: Awaitable[T], printer: asyncio.Future[None]) -> T:
    """`await step`, unless the printer ends first (a write failed): then raise its error."""
    task = asyncio.ensure_future(step)
    await asyncio.wait((task, printer), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    printer.result()  # Raises the failure of the write.
    raise AssertionError("the printer ended before its last record")


def _retrieved(future: asyncio.Future[StreamPosition]) -> None:
    if not future.cancelled():
        future.exception()


async def _print_lines(lines: list[str]) -> None:
    """Print `lines` and flush, on a thread: stdout may be a pipe read slowly (`bkaio stream
    tail NS/STREAM | slow_consumer`), and a write blocked on it must not stop the event loop
    (acknowledgements, the reader's read-ahead, the metadata session run there). Each caller
    awaits one batch before printing the next, so the lines keep their order."""
    if lines:
        text = "".join(f"{line}\n" for line in lines)
        await asyncio.to_thread(write_and_flush, text)


@stream.command("tail")
@click.argument("name")
@click.option("--from", "start", default="earliest", show_default=True, callback=stream_position,
              help="earliest, latest, a seq, or LEDGER:ENTRY@SEQ.")  # fmt: skip
@click.option("--cursor", callback=name_argument("cursor"),
              help="Durable cursor: resume after its last ack; ack what is shown.")  # fmt: skip
@click.option("--count", "max_count", type=POSITIVE_INT, help="Stop after N records.")
@click.option("--no-follow", is_flag=True, help="Stop at the end instead of waiting (tail -f).")
@click.option("--hex", "as_hex", is_flag=True, help="Show payloads in hex.")
@metadata_option
@json_option
def tail(
    metadata_uri: str,
    as_json: bool,
    name: str,
    start: str,
    cursor: str | None,
    max_count: int | None,
    no_follow: bool,
    as_hex: bool,
) -> None:
    """Print the records of NS/STREAM, following new ones like `tail -f`.

    With --no-follow: every record acknowledged before the command started, then exit 0;
    exit 1 naming the segment when one cannot be read.
    """
    namespace_name, stream_name = split_stream_name(name, stream_required=True)
    assert stream_name is not None
    parsed = _parse_start(start)

    async def go() -> None:
        async with connected(metadata_uri) as bk:
            namespace = await _namespace(bk, namespace_name)
            begin = (
                await _position_for_seq(namespace, stream_name, parsed)
                if isinstance(parsed, int)
                else parsed
            )
            reader = await namespace.open_reader(stream_name, begin, cursor=cursor)
            # The exact end: after the last acknowledged record, not the bookies' lagging LAC.
            end = await reader.acknowledged_end() if no_follow else None
            try:
                await _show_records(
                    reader,
                    end=end,
                    max_count=max_count,
                    ack=cursor is not None,
                    as_hex=as_hex,
                    as_json=as_json,
                )
            finally:
                await reader.close()

    with suppress(KeyboardInterrupt):
        run(go())


async def _show_records(
    reader: StreamReader,
    *,
    end: int | None,
    max_count: int | None,
    ack: bool,
    as_hex: bool,
    as_json: bool,
) -> None:
    """Print `reader`'s records as they come, before seq `end`, `max_count` at most; `ack`: move
    the cursor past what was printed. What the reader has at hand is one write and one ack."""
    shown = 0
    while max_count is None or shown < max_count:
        wanted = (
            _PRINT_BATCH_LINES if max_count is None else min(_PRINT_BATCH_LINES, max_count - shown)
        )
        if end is not None:
            if reader.next_seq >= end:
                break
            wanted = min(wanted, end - reader.next_seq)  # Seqs are consecutive.
        records = await reader.read_batch(wanted)  # Waits only when none is at hand.
        await _print_lines([_record_line(record, as_hex, as_json) for record in records])
        shown += len(records)
        if ack and records:
            await reader.ack(records[-1].position)


def _record_line(record: StreamRecord, as_hex: bool, as_json: bool) -> str:
    payload = "hex:" + record.payload.hex() if as_hex else payload_text(record.payload)
    if as_json:
        return json.dumps({**record.position.to_dict(), "payload": payload})
    return f"{record.position}\t{payload}"


@stream.command("truncate")
@click.argument("name")
@click.option(
    "--before",
    required=True,
    callback=stream_position,
    help="A seq or LEDGER:ENTRY@SEQ: drop whole segments before it.",
)
@click.option("--force", is_flag=True, help="Also past the slowest durable cursor.")
@metadata_option
@json_option
def truncate(metadata_uri: str, as_json: bool, name: str, before: str, force: bool) -> None:
    """Delete the sealed segments of NS/STREAM that end before a position."""
    from bkaio.stream import StreamPosition

    namespace_name, stream_name = split_stream_name(name, stream_required=True)
    assert stream_name is not None

    async def go() -> dict[str, Any]:
        async with connected(metadata_uri) as bk:
            namespace = await _namespace(bk, namespace_name)
            if before.isdigit():
                seq = int(before)
                position = StreamPosition(-1, -1, seq)  # Only the seq matters here.
            else:
                position = StreamPosition.parse(before)
            result = await namespace.truncate(stream_name, before=position, force=force)
            return {"removed_ledgers": list(result.removed_ledgers), "first_seq": result.first_seq}

    result = run(go())
    human = f"removed {len(result['removed_ledgers'])} ledgers; first seq now {result['first_seq']}"
    emit(result, as_json=as_json, human=human)


@stream.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete a namespace together with its streams.")
@metadata_option
@json_option
def delete(metadata_uri: str, as_json: bool, name: str, force: bool) -> None:
    """Delete stream NS/STREAM (its ledgers and cursors), or namespace NS."""
    namespace_name, stream_name = split_stream_name(name, stream_required=False)

    async def go() -> None:
        from bkaio.stream import delete_namespace

        async with connected(metadata_uri) as bk:
            if stream_name is None:
                await delete_namespace(bk, namespace_name, force=force)
            else:
                await (await _namespace(bk, namespace_name)).delete_stream(stream_name)

    run(go())
    emit({"deleted": name}, as_json=as_json, human=f"deleted {name}")


@stream.command("cursors")
@click.argument("name")
@metadata_option
@json_option
def cursors(metadata_uri: str, as_json: bool, name: str) -> None:
    """The durable cursors of NS/STREAM, with their lag behind the end."""
    namespace_name, stream_name = split_stream_name(name, stream_required=True)
    assert stream_name is not None

    async def go() -> list[dict[str, Any]]:
        async with connected(metadata_uri) as bk:
            namespace = await _namespace(bk, namespace_name)
            return [
                {
                    "cursor": c.name,
                    "position": str(c.position),
                    "seq": c.position.seq,
                    "lag": c.lag,
                    "mtime_ms": c.mtime_ms,
                }
                for c in await namespace.cursors(stream_name)
            ]

    rows = run(go())
    emit(rows, as_json=as_json, human=table(rows, ["cursor", "position", "lag"]))


@stream.command("retain")
@click.argument("namespaces", nargs=-1, callback=name_argument("namespace"))
@click.option("--every", "interval", type=POSITIVE_SECONDS,
              help="Keep running, one pass every this many seconds.")  # fmt: skip
@metadata_option
@json_option
def retain(
    metadata_uri: str, as_json: bool, namespaces: tuple[str, ...], interval: float | None
) -> None:
    """Apply the retention policy of NAMESPACES (default: all) once, or --every S seconds."""

    async def go() -> list[dict[str, Any]]:
        from bkaio.stream import apply_retention, run_retention

        async with connected(metadata_uri) as bk:
            names = list(namespaces) or None
            for name in namespaces:  # A mistyped one: NamespaceNotFoundError, not "nothing".
                await _namespace(bk, name)
            if interval is not None:
                await run_retention(bk, interval_seconds=interval, namespaces=names)
            reports = await apply_retention(bk, names)
            return [
                {"namespace": r.namespace, "stream": stream_name, "removed_ledgers": list(ids)}
                for r in reports
                for stream_name, ids in r.removed.items()
            ]

    rows = run(go())
    human = table(rows, ["namespace", "stream", "removed_ledgers"]) if rows else "nothing to remove"
    emit(rows, as_json=as_json, human=human)
