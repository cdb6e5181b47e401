"""`bkaio stream info NS/STREAM`: a stream at a glance (segments, seqs, bytes, retention,
cursors). A subcommand of `bkaio stream`, kept beside bkaio/cli/stream_cmd.py (at its size
bound); bkaio/cli/main.py adds it to the `stream` group. Without text to show, each part says
so ("no segments", "no cursors", "0 (next seq N)"), never a bare "(none)" or "None".
"""

from __future__ import annotations

from typing import Any

import click

from bkaio.cli.common import json_option, metadata_option, run
from bkaio.cli.output import emit, render_human, table
from bkaio.cli.params import split_stream_name
from bkaio.cli.stream_cmd import connected


def _segment_row(segment: Any) -> dict[str, Any]:
    return {
        "ledger_id": segment.ledger_id,
        "state": segment.state.value,
        "first_seq": segment.first_seq,
        "last_seq": None if segment.is_open else segment.last_seq,
        "bytes": None if segment.is_open else segment.bytes,
        "ctime_ms": segment.ctime_ms,
        "closed_ms": segment.closed_ms or None,
    }


@click.command("info")
@click.argument("name")
@metadata_option
@json_option
def info(metadata_uri: str, as_json: bool, name: str) -> None:
    """NS/STREAM at a glance: segments, first and last seq, bytes, retention, cursors.

    `bytes` counts sealed segments; the open segment's size is known once it is sealed.
    """
    namespace_name, stream_name = split_stream_name(name, stream_required=True)
    assert stream_name is not None

    async def go() -> dict[str, Any]:
        from bkaio.stream import open_namespace

        async with connected(metadata_uri) as bk:
            namespace = await open_namespace(bk, namespace_name)
            meta = await namespace.stream_metadata(stream_name)
            end_seq = await namespace.end_seq(stream_name)
            settings = namespace.settings
            cursor_rows = [
                {"cursor": c.name, "position": str(c.position), "seq": c.position.seq,
                 "lag": c.lag, "mtime_ms": c.mtime_ms}
                for c in await namespace.cursors(stream_name)
            ]  # fmt: skip
        return {
            "stream": name,
            "epoch": meta.epoch,
            "ctime_ms": meta.ctime_ms,
            "first_seq": meta.first_seq,
            "last_seq": end_seq - 1 if end_seq > meta.first_seq else None,
            "records": end_seq - meta.first_seq,
            "bytes": meta.sealed_bytes,
            "writer_open": meta.open_segment is not None,
            "segments": [_segment_row(segment) for segment in meta.segments],
            "retention": {
                "seconds": settings.retention_seconds,
                "bytes": settings.retention_bytes,
                "ignores_cursors": settings.retention_ignores_cursors,
            },
            "cursors": cursor_rows,
        }

    report = run(go())
    retention = report["retention"]
    first, last = report["first_seq"], report["last_seq"]
    summary = {
        "stream": name,
        "records": f"{report['records']} "
        + (f"(seq {first}..{last})" if last is not None else f"(next seq {first})"),
        "bytes": f"{report['bytes']} in sealed segments",
        "writer": "open" if report["writer_open"] else "none",
        "retention": (
            f"{retention['seconds'] or '-'} s, {retention['bytes'] or '-'} bytes"
            + (", ignores cursors" if retention["ignores_cursors"] else "")
        ),
    }
    human = "\n\n".join(
        [
            render_human(summary),
            table(report["segments"], ["ledger_id", "state", "first_seq", "last_seq", "bytes"])
            if report["segments"]
            else "no segments",
            table(report["cursors"], ["cursor", "position", "lag"])
            if report["cursors"]
            else "no cursors",
        ]
    )
    emit(report, as_json=as_json, human=human)
