"""The bookie-level cookie check at start: directories' cookies against the metadata copy.

Each shard stamps its journal, ledger and index directories with a `Cookie`
(bkaio/entrylog/cookie.py). The metadata store keeps a copy per bookie under
`/cookies/<bookie_id>`: JSON `{"shard_count": N, "shards": [<cookie of shard i>, ...]}`. The copy
is the source of truth (BookKeeper's rule): a directory set that disagrees with it, a changed
shard count, or empty directories while the copy exists (a wiped or swapped disk) refuse to
start with `CookieMismatchError`. A fresh bookie (no copy, empty directories) gets new cookies
and a new copy. Blocking directory access runs in an executor.
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
from bkaio.entrylog.cookie import Cookie, expected_cookie, read_cookie, verify_or_stamp
from bkaio.errors import CookieMismatchError
from bkaio.meta import CookieStore

log = structlog.get_logger(__name__)


def shard_directories(storage: StorageConfig) -> list[Path]:
    return [*storage.journal.directories, *storage.ledger_dirs, *storage.index_dirs]


def _expected(config: BookieConfig, shard_index: int, instance_id: str = "") -> Cookie:
    storage = config.storage[shard_index]
    return expected_cookie(
        bookie_id=config.bookie_id,
        shard_index=shard_index,
        shard_count=config.shard_count,
        journal_dirs=storage.journal.directories,
        ledger_dirs=storage.ledger_dirs,
        index_dirs=storage.index_dirs,
        instance_id=instance_id,
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


def verify_shard_directories(config: BookieConfig, stored: list[Cookie] | None) -> list[Cookie]:
    """Check (or stamp) every shard's directories; blocking, so run it in an executor."""
    where = f"metadata cookie of {config.bookie_id}"
    if stored is not None and len(stored) != config.shard_count:
        raise CookieMismatchError(
            f"{where} says {len(stored)} shards, the configuration {config.shard_count}: the "
            "shard count routes ledgers (L % shards) and may not change on a bookie with data"
        )
    cookies: list[Cookie] = []
    for shard_index in range(config.shard_count):
        directories = shard_directories(config.storage[shard_index])
        if stored is None:
            cookies.append(verify_or_stamp(_expected(config, shard_index), directories))
            continue
        if not _any_stamped(directories):
            raise CookieMismatchError(
                f"shard {shard_index} of {config.bookie_id}: the metadata has a cookie but "
                f"{', '.join(str(d) for d in directories)} hold none: the disks were wiped or "
                "replaced; decommission the bookie (or delete its metadata cookie) to rejoin"
            )
        instance_id = stored[shard_index].instance_id
        cookie = verify_or_stamp(_expected(config, shard_index, instance_id), directories)
        problems = stored[shard_index].mismatches(cookie)
        if problems:
            raise CookieMismatchError(
                f"shard {shard_index} of {config.bookie_id} does not match {where}: "
                + "; ".join(problems)
            )
        cookies.append(cookie)
    return cookies


async def check_cookies(
    config: BookieConfig,
    cookie_store: CookieStore,
    before_publish: Callable[[list[Cookie]], Awaitable[None]] | None = None,
) -> list[Cookie]:
    """Verify the directories against the metadata copy (creating both on a fresh bookie).

    When metadata has no copy yet (a new bookie, or one whose disks were formatted and its
    copy dropped), `before_publish(cookies)` runs after the directories are stamped and before
    the copy is written: what it persists (the limbo set) survives a crash in between, since
    the next start finds no copy again."""
    versioned = await cookie_store.get(config.bookie_id)
    stored = None
    if versioned is not None:
        stored = decode_cookie_copy(versioned.data, f"/cookies/{config.bookie_id}")
    loop = asyncio.get_running_loop()
    cookies = await loop.run_in_executor(None, verify_shard_directories, config, stored)
    if versioned is None:
        if before_publish is not None:
            await before_publish(cookies)
        await cookie_store.put(config.bookie_id, encode_cookie_copy(cookies), expected_version=0)
        log.info("bookie_cookie_created", bookie_id=config.bookie_id, shards=len(cookies))
    return [replace(c) for c in cookies]
