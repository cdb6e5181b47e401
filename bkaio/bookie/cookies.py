"""The bookie-level cookie check at start: directories' cookies against the metadata copy.

Each shard stamps its journal, ledger and index directories with a `Cookie`
(bkaio/entrylog/cookie.py). The metadata store keeps a copy per bookie under
`/cookies/<bookie_id>`: JSON `{"shard_count": N, "shards": [<cookie of shard i>, ...]}`. The copy
is the source of truth (BookKeeper's rule): a directory set that disagrees with it, a changed
shard count, or empty directories while the copy exists (a wiped or swapped disk) refuse to
start with `CookieMismatchError`. A fresh bookie (no copy, empty directories) gets new cookies
and a new copy. Blocking directory access runs in an executor.

The cookies name the cluster they were stamped in (its `/instanceid`, BookKeeper's
Cookie.instanceId), since a re-created cluster (`metaformat`, `nukeexistingcluster` then
`initnewcluster`) hands out the old one's ledger ids again and holds no copy: directories that
name another cluster refuse to start. No copy but stamped directories is the start that stamped
them and died before publishing, adopted when they name this cluster; cookies from before the
cluster was recorded are only trusted next to this cluster's copy (BookKeeper refuses stamped
directories without a copy). A directory the start cannot use (`OSError`) is a `ConfigError`
naming the setting that places it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import structlog

from bkaio.config import BookieConfig
from bkaio.entrylog.config import StorageConfig
from bkaio.entrylog.cookie import (
    COOKIE_FILE,
    Cookie,
    expected_cookie,
    read_cookie,
    verify_or_stamp,
)
from bkaio.errors import ConfigError, CookieMismatchError
from bkaio.meta import CookieStore

log = structlog.get_logger(__name__)


def shard_directories(storage: StorageConfig) -> list[Path]:
    return [*storage.journal.directories, *storage.ledger_dirs, *storage.index_dirs]


def _expected(
    config: BookieConfig, shard_index: int, instance_id: str, cluster_instance_id: str
) -> Cookie:
    storage = config.storage[shard_index]
    return expected_cookie(
        bookie_id=config.bookie_id,
        shard_index=shard_index,
        shard_count=config.shard_count,
        journal_dirs=storage.journal.directories,
        ledger_dirs=storage.ledger_dirs,
        index_dirs=storage.index_dirs,
        instance_id=instance_id,
        cluster_instance_id=cluster_instance_id,
    )


def encode_cookie_copy(cookies: list[Cookie]) -> bytes:
    body = {"shard_count": len(cookies), "shards": [c.to_bytes().decode() for c in cookies]}
    return json.dumps(body, sort_keys=True).encode()


def decode_cookie_copy(data: bytes, where: str) -> list[Cookie]:
    try:
        body = json.loads(data)
        shards = [Cookie.from_bytes(s.encode(), where=where) for s in body["shards"]]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CookieMismatchError(f"{where}: unreadable cookie copy ({error!r})") from error
    return shards


def _any_stamped(directories: list[Path]) -> bool:
    return any(read_cookie(d) is not None for d in directories if d.exists())


def _format_hint(config: BookieConfig) -> str:
    config_file = config.source if config.source is not None else "FILE"
    return (
        "if metadata.uri names the wrong cluster, correct it; if the cluster was re-created "
        "(metaformat, or nukeexistingcluster then initnewcluster), the data here belong to the "
        "old one, whose ledger ids the new one hands out again: wipe them with "
        f"`bkaio bookie format --force --config {config_file}`"
    )


def _other_cluster(config: BookieConfig, what: str, named: str, ours: str) -> CookieMismatchError:
    return CookieMismatchError(
        f"{what} was stamped in cluster instance {named}, but metadata.uri holds cluster "
        f"instance {ours}: " + _format_hint(config)
    )


def _check_cluster(
    config: BookieConfig, directories: list[Path], cluster_instance_id: str, *, copied: bool
) -> None:
    """Refuse directories stamped in another cluster, or (without this cluster's copy of the
    cookie to vouch for them) in a cluster not recorded; `copied`: metadata has the copy."""
    for directory in directories:
        cookie = read_cookie(directory) if directory.exists() else None
        if cookie is None:
            continue  # Empty or unstamped: verify_or_stamp decides.
        named = cookie.cluster_instance_id
        if named and named != cluster_instance_id:
            raise _other_cluster(config, str(directory / COOKIE_FILE), named, cluster_instance_id)
        if not named and not copied:
            raise CookieMismatchError(
                f"{directory / COOKIE_FILE} names no cluster instance (stamped before bkaio "
                f"recorded it) and cluster instance {cluster_instance_id} holds no cookie of "
                f"{config.bookie_id}, so nothing shows these directories belong to it: "
                + _format_hint(config)
            )


def _unusable(config: BookieConfig, directories: list[Path], error: OSError) -> ConfigError:
    """An OSError met checking a shard's directories, naming the setting that places the
    directory it concerns (the directory itself, inside it, or a parent it needed)."""
    culprit = Path(error.filename) if isinstance(error.filename, str) else None
    matches = [] if culprit is None else [d for d in directories if culprit == d]
    if culprit is not None:
        matches += [d for d in directories if d in culprit.parents or culprit in d.parents]
    if not matches:
        listed = ", ".join(str(d) for d in directories)
        return ConfigError(f"storage directories {listed}: cannot use them: {error}")
    directory = matches[0]
    return ConfigError(f"{config.directory_setting(directory)}: cannot use {directory}: {error}")


def verify_shard_directories(
    config: BookieConfig, stored: list[Cookie] | None, cluster_instance_id: str
) -> list[Cookie]:
    """Check (or stamp) every shard's directories; blocking, so run it in an executor."""
    where = f"metadata cookie of {config.bookie_id}"
    if stored is not None and len(stored) != config.shard_count:
        raise CookieMismatchError(
            f"{where} says {len(stored)} shards, the configuration {config.shard_count}: the "
            "shard count routes ledgers (L % shards) and may not change on a bookie with data"
        )
    for copy in stored or ():
        if copy.cluster_instance_id not in ("", cluster_instance_id):
            raise _other_cluster(config, where, copy.cluster_instance_id, cluster_instance_id)
    cookies: list[Cookie] = []
    for shard_index in range(config.shard_count):
        directories = shard_directories(config.storage[shard_index])
        try:
            cookies.append(
                _verify_shard(config, shard_index, directories, stored, cluster_instance_id)
            )
        except OSError as error:
            raise _unusable(config, directories, error) from error
    return cookies


def _verify_shard(
    config: BookieConfig,
    shard_index: int,
    directories: list[Path],
    stored: list[Cookie] | None,
    cluster_instance_id: str,
) -> Cookie:
    _check_cluster(config, directories, cluster_instance_id, copied=stored is not None)
    if stored is None:
        expected = _expected(config, shard_index, "", cluster_instance_id)
        return verify_or_stamp(expected, directories)
    if not _any_stamped(directories):
        raise CookieMismatchError(
            f"shard {shard_index} of {config.bookie_id}: the metadata has a cookie but "
            f"{', '.join(str(d) for d in directories)} hold none: the disks were wiped or "
            "replaced; decommission the bookie (or delete its metadata cookie) to rejoin"
        )
    copy = stored[shard_index]
    expected = _expected(config, shard_index, copy.instance_id, copy.cluster_instance_id)
    cookie = verify_or_stamp(expected, directories)
    problems = copy.mismatches(cookie)
    if problems:
        raise CookieMismatchError(
            f"shard {shard_index} of {config.bookie_id} does not match metadata cookie of "
            f"{config.bookie_id}: " + "; ".join(problems)
        )
    return cookie


async def check_cookies(
    config: BookieConfig,
    cookie_store: CookieStore,
    before_publish: Callable[[list[Cookie]], Awaitable[None]] | None = None,
    *,
    cluster_instance_id: str,
) -> list[Cookie]:
    """Verify the directories against the metadata copy (creating both on a fresh bookie);
    `cluster_instance_id` is the metadata's cluster (`Metadata.instance_id`).

    When metadata has no copy yet (a new bookie, or one whose disks were formatted and its
    copy dropped), `before_publish(cookies)` runs after the directories are stamped and before
    the copy is written: what it persists (the limbo set) survives a crash in between, since
    the next start finds no copy again."""
    versioned = await cookie_store.get(config.bookie_id)
    stored = None
    if versioned is not None:
        stored = decode_cookie_copy(versioned.data, f"/cookies/{config.bookie_id}")
    loop = asyncio.get_running_loop()
    cookies = await loop.run_in_executor(
        None, verify_shard_directories, config, stored, cluster_instance_id
    )
    if versioned is None:
        if before_publish is not None:
            await before_publish(cookies)
        await cookie_store.put(config.bookie_id, encode_cookie_copy(cookies), expected_version=0)
        log.info("bookie_cookie_created", bookie_id=config.bookie_id, shards=len(cookies))
    return [replace(c) for c in cookies]
