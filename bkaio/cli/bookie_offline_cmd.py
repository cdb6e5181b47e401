"""`bkaio bookie ...` commands on a bookie's directories (BookKeeper's offline shell commands).

    lastmark                checkpoint mark of every journal
    listfilesondisc         journal, entry-log and index files
    readjournal FILE        records of one journal file
    readentrylog LOG        records of one entry log
    localconsistencycheck   every indexed entry read back and verified, per ledger
    updatecookie            re-stamp cookies after a hostname (--old-bookie-id) or directory
                            (--directories) change

Each takes the bookie's `--config FILE` (on the `bkaio bookie` group or the command) and reads
its directories directly; all but updatecookie are safe while the bookie runs. The library
behind them is bkaio/bookie/offline.py and bkaio/bookie/cookie_update.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from bkaio.cli.common import json_option, run
from bkaio.cli.output import emit, emit_stream, payload_text, table
from bkaio.cli.params import BOOKIE_ID, ENTRY_ID, LEDGER_ID, Int
from bkaio.errors import BKError, BookieIOError, ConfigError
from bkaio.journal.errors import JournalError

CONFIG_HELP = "The bookie's TOML configuration file."
CONFIG_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
SHARD = Int(0)


class InconsistentStorageError(BKError):
    """localconsistencycheck found damaged or misplaced entries."""


def config_option(function: Any) -> Any:
    decorator = click.option(
        "--config",
        "config_path",
        type=CONFIG_FILE,
        help=CONFIG_HELP,
    )
    return decorator(function)


def load_config(context: click.Context, config_path: Path | None) -> Any:
    """The bookie configuration named on the command or on the `bkaio bookie` group."""
    path = config_path or context.obj
    if path is None:
        raise click.UsageError("--config FILE is required")
    from bkaio.config import load_bookie_config

    return load_bookie_config(path)


@contextlib.contextmanager
def _bad_argument(name: str) -> Iterator[None]:
    """A file argument that names nothing readable is a usage error (exit 2)."""
    try:
        yield
    except (ConfigError, BookieIOError, JournalError) as error:
        raise click.BadParameter(str(error), param_hint=name) from None


@click.command("lastmark")
@config_option
@json_option
@click.pass_context
def last_mark(context: click.Context, config_path: Path | None, as_json: bool) -> None:
    """The journal position each shard's ledger storage holds everything up to."""
    from bkaio.bookie.offline import last_marks

    marks = [m.to_dict() for m in last_marks(load_config(context, config_path))]
    columns = ["shard", "journal_dir", "file", "offset"]
    emit(marks, as_json=as_json, human=table(marks, columns))


@click.command("listfilesondisc")
@click.option("--journal", "kinds", flag_value="journal", multiple=True, help="Journal files.")
@click.option("--entrylog", "kinds", flag_value="entrylog", multiple=True, help="Entry logs.")
@click.option("--index", "kinds", flag_value="index", multiple=True, help="Index files.")
@config_option
@json_option
@click.pass_context
def list_files_on_disc(
    context: click.Context, kinds: tuple[str, ...], config_path: Path | None, as_json: bool
) -> None:
    """Journal, entry-log and index files of every shard (all kinds unless some are named)."""
    from bkaio.bookie.offline import FILE_KINDS, list_files

    chosen = tuple(sorted(set(kinds))) or FILE_KINDS
    files = [f.to_dict() for f in list_files(load_config(context, config_path), chosen)]
    emit(files, as_json=as_json, human=table(files, ["kind", "shard", "bytes", "path"]))


@click.command("readjournal")
@click.argument("journal_file")
@click.option("--shard", default=0, show_default=True, type=SHARD)
@click.option(
    "--journal", "journal_index", default=0, show_default=True, type=SHARD, help="Journal dir."
)
@click.option("--msg", "payload", is_flag=True, help="Show each entry's payload.")
@config_option
@json_option
@click.pass_context
def read_journal(
    context: click.Context,
    journal_file: str,
    shard: int,
    journal_index: int,
    payload: bool,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """The records of JOURNAL_FILE (a path, a file name, or a file id in decimal)."""
    from bkaio.bookie.offline import JournalEnd, journal_path
    from bkaio.bookie.offline import read_journal as read

    config = load_config(context, config_path) if not Path(journal_file).is_absolute() else None
    end = JournalEnd()
    with _bad_argument("JOURNAL_FILE"):
        path = (
            Path(journal_file)
            if config is None
            else journal_path(config, journal_file, shard=shard, journal=journal_index)
        )
        records = read(path, end, payload=payload)
    emit_stream(records, as_json=as_json, human=_journal_line, key="records", trailer=end.to_dict)
    if not as_json:
        summary = f"{end.records} records"
        if end.zeros_from is not None:
            summary += f"; zeros (preallocated) from offset {end.zeros_from}"
        if end.torn_tail is not None:
            summary += f"; torn tail at {end.torn_tail}"
        for corruption in end.corruption or []:
            summary += f"; CORRUPT at {corruption}"
        emit(summary, as_json=False)


def _journal_line(record: dict[str, Any]) -> str:
    fields = " ".join(
        f"{key}={payload_text(value) if isinstance(value, bytes) else value}"
        for key, value in record.items()
        if key not in ("offset", "end", "kind")
    )
    return f"{record['offset']}\t{record['kind']}\t{fields}"


@click.command("readentrylog")
@click.argument("entry_log")
@click.option("--shard", default=0, show_default=True, type=SHARD)
@click.option("--disk", default=0, show_default=True, type=SHARD, help="Ledger directory.")
@click.option("--ledgerid", "ledger_id", type=LEDGER_ID, help="Only this ledger's entries.")
@click.option("--entryid", "entry_id", type=ENTRY_ID, help="Only this entry (with --ledgerid).")
@click.option("--startpos", "start", type=SHARD, help="From this byte offset.")
@click.option("--endpos", "end", type=SHARD, help="Up to this byte offset.")
@click.option("--msg", "payload", is_flag=True, help="Show each entry's payload.")
@config_option
@json_option
@click.pass_context
def read_entry_log(
    context: click.Context,
    entry_log: str,
    shard: int,
    disk: int,
    ledger_id: int | None,
    entry_id: int | None,
    start: int | None,
    end: int | None,
    payload: bool,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """The records of ENTRY_LOG (a path, `0000000a.log`, or a log id in decimal)."""
    from bkaio.bookie.offline import entry_log_path
    from bkaio.bookie.offline import read_entry_log as read

    if entry_id is not None and ledger_id is None:
        raise click.BadParameter("--entryid needs --ledgerid")
    if start is not None and end is not None and end < start:
        raise click.BadParameter(f"--endpos {end} is before --startpos {start}")
    config = load_config(context, config_path) if not Path(entry_log).is_absolute() else None
    with _bad_argument("ENTRY_LOG"):
        path = (
            Path(entry_log)
            if config is None
            else entry_log_path(config, entry_log, shard=shard, disk=disk)
        )
        records = read(
            path, ledger_id=ledger_id, entry_id=entry_id, start=start, end=end, payload=payload
        )
    emit_stream(records, as_json=as_json, human=_entry_line)


def _entry_line(record: dict[str, Any]) -> str:
    if "problem" in record:
        return f"{record['offset']}\tDAMAGED\t{record['problem']}"
    shown = payload_text(record["payload"]) if "payload" in record else ""
    return (
        f"{record['offset']}\tledger={record['ledger_id']} entry={record['entry_id']} "
        f"lac={record['lac']} bytes={record['payload_bytes']}\t{shown}".rstrip()
    )


@click.command("localconsistencycheck")
@click.option("--shard", default=None, type=SHARD, help="Only this shard (default: every one).")
@config_option
@json_option
@click.pass_context
def local_consistency_check(
    context: click.Context, shard: int | None, config_path: Path | None, as_json: bool
) -> None:
    """Read back every indexed entry and verify its checksum, digest and index location.

    Prints one row per ledger; exits 1 when anything is damaged or misplaced."""
    from bkaio.bookie.offline import check_consistency

    report = check_consistency(load_config(context, config_path), shard=shard)
    result = report.to_dict()
    rows = result["ledgers"]
    assert isinstance(rows, list)
    human = table(rows, ["ledger_id", "entries", "problems", "ok"])
    for problem in report.problems[:20]:
        human += f"\nledger {problem.ledger_id} entry {problem.entry_id}: {problem.problem}"
    emit(result, as_json=as_json, human=human)
    if not report.ok:
        raise InconsistentStorageError(
            f"{report.problem_count} of {report.entries} entries are damaged or misplaced in "
            f"{sum(1 for r in report.ledgers.values() if r.problems)} ledgers"
        )


@click.command("updatecookie")
@click.option(
    "--old-bookie-id",
    type=BOOKIE_ID,
    help="The id the bookie had (its hostname or address changed; the config gives the new).",
)
@click.option(
    "--directories",
    is_flag=True,
    help="The bookie's directories moved: stamp the configured paths.",
)
@config_option
@json_option
@click.pass_context
def update_cookie(
    context: click.Context,
    old_bookie_id: str | None,
    directories: bool,
    config_path: Path | None,
    as_json: bool,
) -> None:
    """Update a stopped bookie's cookies after its id or its directories changed."""
    if (old_bookie_id is None) == (not directories):
        raise click.UsageError("updatecookie needs exactly one of --old-bookie-id or --directories")
    config = load_config(context, config_path)

    async def go() -> Any:
        from bkaio.bookie.cookie_update import update_bookie_id, update_directories
        from bkaio.meta import open_metadata

        metadata = await open_metadata(config.metadata.uri)
        try:
            if old_bookie_id is not None:
                return await update_bookie_id(config, metadata, old_bookie_id)
            return await update_directories(config, metadata)
        finally:
            await metadata.close()

    report = run(go())
    if report.already_done:
        human = f"{report.bookie_id}: cookies already up to date"
    else:
        human = f"{report.bookie_id}: {report.directories_stamped} directories re-stamped"
        if report.old_bookie_id is not None:
            human += f", metadata cookie moved from {report.old_bookie_id}"
            if report.ledgers_naming_old_id:
                human += (
                    f"; {report.ledgers_naming_old_id} ledgers still name "
                    f"{report.old_bookie_id} (autorecovery re-replicates them)"
                )
    emit(report.to_dict(), as_json=as_json, human=human)


COMMANDS: tuple[click.Command, ...] = (
    last_mark,
    list_files_on_disc,
    read_journal,
    read_entry_log,
    local_consistency_check,
    update_cookie,
)
