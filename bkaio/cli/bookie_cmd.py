"""`bkaio bookie`: run one bookie (what systemd starts), format its directories, describe it.

The commands that read a bookie's directories offline (lastmark, readjournal, ...) are in
bookie_offline_cmd.py and registered on this group.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from bkaio.cli import bookie_offline_cmd
from bkaio.cli.bookie_offline_cmd import CONFIG_FILE, CONFIG_HELP, load_config
from bkaio.cli.common import json_option, run
from bkaio.cli.output import emit
from bkaio.errors import BKError, ConfigError


class DirectoryNotEmptyError(BKError):
    """Formatting would destroy data and --force was not given."""


class BookieStillRunningError(BKError):
    """Formatting a bookie that is registered (alive) would pull its disks from under it."""


def _directories(config: Any) -> list[Path]:
    from bkaio.bookie.cookies import shard_directories

    found: list[Path] = []
    for storage in config.storage:
        found.extend(shard_directories(storage))
    return found


@click.group(invoke_without_command=True)
@click.option("--config", "config_path", type=CONFIG_FILE, help=CONFIG_HELP)
@click.pass_context
def bookie(context: click.Context, config_path: Path | None) -> int | None:
    """Run a bookie with --config FILE, or inspect and repair its directories (subcommands)."""
    context.obj = config_path
    if context.invoked_subcommand is not None:
        return None
    if config_path is None:
        raise click.UsageError("bkaio bookie needs --config FILE (or a subcommand: see --help)")
    from bkaio.bookie import run_bookie

    return run_bookie(config_path)


for _command in bookie_offline_cmd.COMMANDS:
    bookie.add_command(_command)
bookie.add_command(bookie_offline_cmd.read_entry_log, name="readlog")  # BookKeeper's name.


@bookie.command("format")
@click.option("--config", "config_path", type=CONFIG_FILE, help=CONFIG_HELP)
@click.option("--force", is_flag=True, help="Wipe directories that hold data, and the cookie.")
@json_option
@click.pass_context
def format_bookie(
    context: click.Context, config_path: Path | None, force: bool, as_json: bool
) -> None:
    """Initialise (or, with --force, wipe) the bookie's directories and its metadata cookie."""
    config = load_config(context, config_path)
    directories = _directories(config)
    holding = [d for d in directories if d.exists() and any(d.iterdir())]
    if holding and not force:
        raise DirectoryNotEmptyError(
            f"{len(holding)} directories hold data (first: {holding[0]}); "
            "formatting destroys it: pass --force to wipe them"
        )
    run(_refuse_if_registered(config))
    # Every directory is made before any is wiped: one that cannot be made stops the format
    # with the data as it was, and the error names the key that places it.
    _make_directories(config, directories)
    for directory in holding:
        shutil.rmtree(directory)
    _make_directories(config, directories)

    async def drop_cookie() -> bool:
        from bkaio.meta import open_metadata

        meta = await open_metadata(config.metadata.uri)
        try:
            existing = await meta.cookies.get(config.bookie_id)
            if existing is None:
                return False
            if not force:
                raise DirectoryNotEmptyError(
                    f"metadata holds a cookie for {config.bookie_id}: pass --force to drop it"
                )
            await meta.cookies.delete(config.bookie_id)
            return True
        finally:
            await meta.close()

    dropped = run(drop_cookie())
    result = {
        "bookie_id": config.bookie_id,
        "directories": [str(d) for d in directories],
        "wiped": [str(d) for d in holding],
        "cookie_dropped": dropped,
    }
    emit(
        result,
        as_json=as_json,
        human=f"formatted {config.bookie_id}: {len(directories)} directories ready, "
        f"{len(holding)} wiped, metadata cookie {'dropped' if dropped else 'absent'}",
    )


def _make_directories(config: Any, directories: list[Path]) -> None:
    for directory in directories:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            setting = config.directory_setting(directory)
            raise ConfigError(f"{setting}: cannot create {directory}: {error}") from None


async def _refuse_if_registered(config: Any) -> None:
    """A registered bookie is alive (its registration lives only as long as its lease)."""
    from bkaio.meta import open_metadata

    meta = await open_metadata(config.metadata.uri)
    try:
        registered = {info.bookie_id: info for info in await meta.bookies.list()}
    finally:
        await meta.close()
    info = registered.get(config.bookie_id)
    if info is not None:
        raise BookieStillRunningError(
            f"bookie {config.bookie_id} is registered and alive "
            f"({'read-only' if info.read_only else 'writable'}, admin {info.admin_url or 'none'})"
            ": stop it before formatting its directories; nothing was wiped"
        )


@bookie.command("info")
@click.option("--config", "config_path", type=CONFIG_FILE, help=CONFIG_HELP)
@json_option
@click.pass_context
def bookie_info(context: click.Context, config_path: Path | None, as_json: bool) -> None:
    """What the configuration resolves to: identity, ports, directories and their space.

    free_bytes/total_bytes are the bookie's space (bkaio/bookie/space.py: the filesystems of its
    ledger directories, each counted once), the same figures a running bookie reports."""
    from bkaio.bookie.space import directory_space, ledger_directories, measure_space
    from bkaio.security.tokens import redact_uri

    config = load_config(context, config_path)
    directories = []
    for directory in _directories(config):
        space = directory_space(directory)
        directories.append(
            {
                "path": str(directory),
                "exists": space.exists,
                "total_bytes": space.total_bytes,
                "free_bytes": space.free_bytes,
            }
        )
    result = {
        "bookie_id": config.bookie_id,
        "listen": f"{config.host}:{config.port}",
        "shards": config.shard_count,
        "shard_ports": [config.shard_port(i) for i in range(config.shard_count)],
        "rack": config.rack,
        "metadata": redact_uri(config.metadata.uri),
        "admin": config.admin_url(config.admin.port) if config.admin.enabled else None,
        **measure_space(ledger_directories(config)).to_dict(),
        "directories": directories,
        # false: BookKeeper's journalSyncData=false; a power failure can lose acknowledged entries.
        "journal_sync": all(storage.journal.sync for storage in config.storage),
        "limbo": _limbo_of(config),
        # The running bookie's health, mode and supervised tasks (its admin `/status`); null
        # when it does not answer (not running, or admin HTTP off).
        "status": _running_status(config) if config.admin.enabled else None,
    }
    emit(result, as_json=as_json)


def _limbo_of(config: Any) -> dict[str, Any]:
    """Ledgers the bookie still has in limbo, from its directories (docs/autorecovery.md)."""
    from bkaio.bookie.limbo import load_limbo

    records = load_limbo(config)
    ledgers = sum(len(record.ledgers) for record in records.values())
    entered = min((record.entered_at for record in records.values()), default=None)
    return {
        "ledgers": ledgers,
        "per_shard": {str(shard): len(record.ledgers) for shard, record in records.items()},
        "entered_at": entered,
        "seconds": round(time.time() - entered, 1) if entered is not None else 0.0,
        "reason": next(iter(records.values())).reason if records else None,
    }


def _running_status(config: Any) -> dict[str, Any] | None:
    """The running bookie's admin `/status`, over HTTPS (its [tls] client CA) when it serves it.

    The request names this configuration's bookie id: another bookie answering on the port
    (409) is reported as an error in the status, not shown as this bookie's."""
    from bkaio.security.admin_client import WRONG_BOOKIE_STATUS, admin_headers
    from bkaio.security.tls import bookie_client_tls_context

    url = f"{config.admin_url(config.admin.port)}/status"
    context = bookie_client_tls_context(config.tls) if config.admin_https else None
    request = urllib.request.Request(url, headers=admin_headers(config.bookie_id))
    try:
        with urllib.request.urlopen(request, timeout=2.0, context=context) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code != WRONG_BOOKIE_STATUS:
            return None
        try:
            reached = json.loads(error.read()).get("bookie_id", "another bookie")
        except (OSError, ValueError, AttributeError):
            reached = "another bookie"
        return {
            "error": f"the admin API at {url} is bookie {reached}'s, not {config.bookie_id}'s: "
            "check admin.port and admin.host"
        }
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None
