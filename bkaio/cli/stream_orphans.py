"""`bkaio stream orphans NS [--older-than S] [--delete]`: ledgers tagged for a stream of NS
that no stream record names (bkaio/stream/orphans.py), and with --delete, their removal.

A subcommand of `bkaio stream`, kept beside bkaio/cli/stream_cmd.py (which is near its size
bound); bkaio/cli/main.py adds it to the `stream` group.
"""

from __future__ import annotations

from typing import Any

import click

from bkaio.cli.common import json_option, metadata_option, run
from bkaio.cli.output import emit, table
from bkaio.cli.params import FiniteFloat, name_argument
from bkaio.cli.stream_cmd import connected
from bkaio.stream.orphans import DEFAULT_ORPHAN_AGE_SECONDS

_COLUMNS = ["ledger_id", "stream", "epoch", "job", "state", "bytes", "ctime_ms"]


def _row(orphan: Any) -> dict[str, Any]:
    return {
        "ledger_id": orphan.ledger_id,
        "stream": orphan.stream if orphan.stream_exists else f"{orphan.stream} (deleted)",
        "epoch": orphan.epoch,
        "job": orphan.job,
        "state": orphan.state,
        "bytes": orphan.bytes,
        "ctime_ms": orphan.ctime_ms,
    }


@click.command("orphans")
@click.argument("namespace", callback=name_argument("namespace"))
@click.option(
    "--older-than",
    type=FiniteFloat(min=0),
    default=DEFAULT_ORPHAN_AGE_SECONDS,
    show_default=True,
    help="Only ledgers created more than this many seconds ago.",
)
@click.option(
    "--delete",
    is_flag=True,
    help=(
        "Delete each one that its stream's record, read again just before, still does not name"
        " and no Spark job's registry lists."
    ),
)
@metadata_option
@json_option
def orphans(
    metadata_uri: str, as_json: bool, namespace: str, older_than: float, delete: bool
) -> None:
    """List ledgers tagged for a stream of NAMESPACE that no stream record names (a writer or a
    Spark job that died before naming them, a deleted stream's leftovers), created more than
    --older-than seconds ago; with --delete, delete them and say what was kept and why."""

    async def go() -> list[dict[str, Any]]:
        from bkaio.stream.orphans import delete_orphans, find_orphans

        async with connected(metadata_uri) as bk:
            found = [o async for o in find_orphans(bk, namespace, older_than_seconds=older_than)]
            if not delete:
                return [_row(orphan) for orphan in found]
            return [
                {**_row(done.orphan), "action": "deleted" if done.deleted else "kept",
                 "reason": done.reason}
                async for done in delete_orphans(bk, namespace, found)
            ]  # fmt: skip

    rows = run(go())
    columns = [*_COLUMNS, "action", "reason"] if delete else _COLUMNS
    emit(rows, as_json=as_json, human=table(rows, columns) if rows else "no orphan ledgers")
