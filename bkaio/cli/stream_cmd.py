"""`bkaio stream ...`: namespaces and streams from the command line.

    bkaio stream create NS [--quota-bytes N ...]      bkaio stream create NS/STREAM
    bkaio stream list [NS]                            bkaio stream delete NS[/STREAM] [--force]
    bkaio stream write NS/STREAM [PAYLOAD ...]        (no PAYLOAD: one record per stdin line)
    bkaio stream tail NS/STREAM [--from earliest|latest|LEDGER:ENTRY@SEQ|SEQ] [--cursor NAME]
    bkaio stream truncate NS/STREAM --before POSITION [--force]
    bkaio stream cursors NS/STREAM                    bkaio stream retain [NS ...] [--every S]

Positions print as LEDGER:ENTRY@SEQ. Every command takes --metadata (or $BKAIO_METADATA) and
--json; failures are one line on stderr (bkaio/cli/main.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, Literal

import click

from bkaio.cli.common import json_option, metadata_option, run
from bkaio.cli.output import emit, payload_text, table

if TYPE_CHECKING:
    from bkaio.ledger_client import BookKeeper
    from bkaio.stream import Namespace, StreamPosition


def split_name(name: str, *, stream_required: bool) -> tuple[str, str | None]:
    namespace, _, stream = name.partition("/")
    if not namespace or (stream_required and not stream) or "/" in stream:
        wanted = "NAMESPACE/STREAM" if stream_required else "NAMESPACE or NAMESPACE/STREAM"
        raise click.BadParameter(f"{name!r} is not {wanted}")
    return namespace, stream or None


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
    """The position of record `seq` (StreamTruncatedError if it is gone)."""
    from bkaio.stream import StreamPosition
    from bkaio.stream.reader import truncated_error

    meta = await namespace.stream_metadata(stream)
    if seq < meta.first_seq:
        raise truncated_error(f"{namespace.name}/{stream}", seq, meta)
    index = meta.segment_index_for(seq)
    if index is None:
        end = meta.end_seq_if_closed
        raise click.BadParameter(f"seq {seq} is past the end of the stream (next seq {end})")
    segment = meta.segments[index]
    return StreamPosition(segment.ledger_id, seq - segment.first_seq, seq)


@click.group()
def stream() -> None:
    """Namespaces and streams: create, list, write, tail, truncate, delete, cursors, retain."""


@stream.command("create")
@click.argument("name")
@click.option("--quota-bytes", type=click.IntRange(min=1), help="Namespace byte quota.")
@click.option("--max-streams", type=click.IntRange(min=1), help="Namespace stream limit.")
@click.option("--retention-seconds", type=click.FloatRange(min=0, min_open=True))
@click.option("--retention-bytes", type=click.IntRange(min=1))
@click.option("--retention-ignores-cursors", is_flag=True, help="Retention may pass cursors.")
@click.option("--ensemble-size", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--write-quorum", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--ack-quorum", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rack", "racks", multiple=True, help="Placement rack label (repeatable).")
@metadata_option
@json_option
def create(metadata_uri: str, as_json: bool, name: str, **options: Any) -> None:
    """Create namespace NS (with its settings), or stream NS/STREAM in an existing namespace."""
    namespace_name, stream_name = split_name(name, stream_required=False)

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
@click.argument("namespace", required=False)
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
@metadata_option
@json_option
def write(
    metadata_uri: str, as_json: bool, name: str, payloads: tuple[str, ...], as_hex: bool
) -> None:
    """Append PAYLOADs (default: each line of stdin) to NS/STREAM, becoming its writer."""
    namespace_name, stream_name = split_name(name, stream_required=True)
    assert stream_name is not None
    texts = list(payloads) if payloads else [line.rstrip("\n") for line in sys.stdin]
    try:
        records = [bytes.fromhex(t) if as_hex else t.encode() for t in texts]
    except ValueError as error:
        raise click.BadParameter(f"not hex: {error}") from None

    async def go() -> list[dict[str, Any]]:
        async with connected(metadata_uri) as bk:
            namespace = await _namespace(bk, namespace_name)
            writer = await namespace.open_writer(stream_name)
            try:
                positions = await asyncio.gather(*(writer.write(r) for r in records))
            finally:
                await writer.close()
            return [{"position": str(p), **p.to_dict()} for p in positions]

    rows = run(go())
    emit(rows, as_json=as_json, human="\n".join(row["position"] for row in rows))


@stream.command("tail")
@click.argument("name")
@click.option("--from", "start", default="earliest", show_default=True,
              help="earliest, latest, a seq, or LEDGER:ENTRY@SEQ.")  # fmt: skip
@click.option("--cursor", help="Durable cursor: resume after its last ack; ack what is shown.")
@click.option("--count", "max_count", type=click.IntRange(min=1), help="Stop after N records.")
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
    """Print the records of NS/STREAM, following new ones like `tail -f`."""
    import json

    namespace_name, stream_name = split_name(name, stream_required=True)
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
            end = await namespace.end_seq(stream_name) if no_follow else None
            reader = await namespace.open_reader(stream_name, begin, cursor=cursor)
            shown = 0
            try:
                while max_count is None or shown < max_count:
                    if end is not None and reader.next_seq >= end:
                        break
                    record = await reader.__anext__()
                    payload = (
                        "hex:" + record.payload.hex() if as_hex else payload_text(record.payload)
                    )
                    if as_json:
                        line = json.dumps({**record.position.to_dict(), "payload": payload})
                    else:
                        line = f"{record.position}\t{payload}"
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                    shown += 1
                    if cursor is not None:
                        await reader.ack(record.position)
            finally:
                await reader.close()

    with suppress(KeyboardInterrupt):
        run(go())


@stream.command("truncate")
@click.argument("name")
@click.option(
    "--before", required=True, help="A seq or LEDGER:ENTRY@SEQ: drop whole segments before it."
)
@click.option("--force", is_flag=True, help="Also past the slowest durable cursor.")
@metadata_option
@json_option
def truncate(metadata_uri: str, as_json: bool, name: str, before: str, force: bool) -> None:
    """Delete the sealed segments of NS/STREAM that end before a position."""
    from bkaio.stream import StreamPosition

    namespace_name, stream_name = split_name(name, stream_required=True)
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
    namespace_name, stream_name = split_name(name, stream_required=False)

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
    namespace_name, stream_name = split_name(name, stream_required=True)
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
@click.argument("namespaces", nargs=-1)
@click.option("--every", "interval", type=click.FloatRange(min=0, min_open=True),
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
