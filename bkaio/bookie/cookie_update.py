"""`bkaio bookie updatecookie`: re-stamp a stopped bookie whose id or directories changed.

Cookies bind a bookie's directories to its id, shard layout, directory set, instance id and
cluster, in every directory and in metadata (`/cookies/<bookie id>`, bkaio/bookie/cookies.py);
a bookie whose hostname or directories changed refuses to start until they are updated. Two
updates, after BookKeeper's `updatecookie -bookieId` and its directory checks:

- new bookie id (the configuration now resolves to NEW; `old_bookie_id` names the old one): the
  directories' cookies and the metadata copy of OLD must agree; NEW must have no cookie of its
  own; then every directory is stamped with NEW, NEW's copy is written and OLD's deleted. An
  update interrupted after the directories were stamped is finished by running it again.
- moved directories (the configuration lists new paths for the same disks): every configured
  directory must hold a cookie of this bookie and instance (a directory without one is a wiped
  or new disk: refused), as many directories of each kind as before (ledgers are spread over
  disks by position), and each index must hold only ledgers that belong at its position.

Both keep everything else a cookie holds, its cluster instance id included (absent in cookies
stamped before bkaio recorded it): moving a bookie never moves it to another cluster.

Both refuse while the bookie runs (it is registered in metadata, or its journal locks are held).
Ledger metadata keeps naming the old id after an id change: the report counts those ledgers, which
autorecovery treats as under-replicated once OLD is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from bkaio.config import BookieConfig
from bkaio.entrylog.cookie import Cookie, expected_cookie, read_cookie, write_cookie
from bkaio.entrylog.index import INDEX_NAME, LedgerIndex
from bkaio.errors import BKError, CookieMismatchError, MetadataVersionError
from bkaio.journal.errors import JournalError
from bkaio.journal.files import lock_directory
from bkaio.meta import Metadata
from bkaio.meta.cluster_admin import registered_bookie_ids
from bkaio.meta.ledger_metadata import deserialize
from bkaio.meta.ledgers import LEDGERS_PREFIX, ledger_id_of

from .cookies import decode_cookie_copy, encode_cookie_copy, shard_directories


class BookieRunningError(BKError):
    """The bookie is running (registered, or its journal directories are locked)."""


@dataclass(frozen=True, slots=True)
class CookieUpdateReport:
    bookie_id: str
    old_bookie_id: str | None  # Set for an id change.
    directories_stamped: int
    metadata_updated: bool
    already_done: bool  # Nothing needed changing (or an interrupted update was finished).
    ledgers_naming_old_id: int

    def to_dict(self) -> dict[str, object]:
        return {
            "bookie_id": self.bookie_id,
            "old_bookie_id": self.old_bookie_id,
            "directories_stamped": self.directories_stamped,
            "metadata_updated": self.metadata_updated,
            "already_done": self.already_done,
            "ledgers_naming_old_id": self.ledgers_naming_old_id,
        }


def _expected(config: BookieConfig, shard: int, *, bookie_id: str, like: Cookie) -> Cookie:
    """What `config` makes of shard `shard` under `bookie_id`, with `like`'s instance ids."""
    storage = config.storage[shard]
    return expected_cookie(
        bookie_id=bookie_id,
        shard_index=shard,
        shard_count=config.shard_count,
        journal_dirs=storage.journal.directories,
        ledger_dirs=storage.ledger_dirs,
        index_dirs=storage.index_dirs,
        instance_id=like.instance_id,
        cluster_instance_id=like.cluster_instance_id,
    )


@contextlib.contextmanager
def _journals_locked(config: BookieConfig) -> Iterator[None]:
    """Hold every shard's journal lock: a running bookie holds them, so this refuses it."""
    held: list[int] = []
    try:
        for storage in config.storage:
            for directory in storage.journal.directories:
                if not Path(directory).exists():
                    continue
                try:
                    held.append(lock_directory(Path(directory)))
                except JournalError as error:
                    raise BookieRunningError(
                        f"{error}: stop the bookie before updating its cookies"
                    ) from None
        yield
    finally:
        for descriptor in held:
            os.close(descriptor)


def _stamped(directories: list[Path]) -> dict[Path, Cookie | None]:
    return {d: read_cookie(d) if d.exists() else None for d in directories}


async def _refuse_if_registered(metadata: Metadata, *bookie_ids: str) -> None:
    live = set(await registered_bookie_ids(metadata.store)) & set(bookie_ids)
    if live:
        raise BookieRunningError(
            f"bookie {', '.join(sorted(live))} is registered: stop it before updating its cookies"
        )


async def _ledgers_naming(metadata: Metadata, bookie_id: str) -> int:
    count = 0
    async for kv in metadata.store.iterate_prefix(LEDGERS_PREFIX, page_size=500):
        record = deserialize(kv.value, ledger_id=ledger_id_of(kv.key), version=kv.version)
        if any(bookie_id in ensemble for _first, ensemble in record.ensembles):
            count += 1
    return count


async def update_bookie_id(
    config: BookieConfig, metadata: Metadata, old_bookie_id: str
) -> CookieUpdateReport:
    """Re-stamp the bookie configured as `config.bookie_id` that used to be `old_bookie_id`."""
    new_id = config.bookie_id
    if old_bookie_id == new_id:
        raise CookieMismatchError(
            f"the configuration already resolves to {new_id}: give the bookie id it had before"
        )
    await _refuse_if_registered(metadata, old_bookie_id, new_id)
    old_copy = await metadata.cookies.get(old_bookie_id)
    new_copy = await metadata.cookies.get(new_id)
    loop = asyncio.get_running_loop()
    with _journals_locked(config):
        if old_copy is None:
            if new_copy is not None:  # Done before (or by an earlier, finished run).
                await loop.run_in_executor(None, _verify_all, config, new_copy.data, new_id)
                return CookieUpdateReport(new_id, old_bookie_id, 0, False, True, 0)
            raise CookieMismatchError(
                f"metadata has no cookie for {old_bookie_id}: is that the id the bookie had "
                "(`bkaio shell listbookies`, `clusterinfo`)?"
            )
        old_cookies = decode_cookie_copy(old_copy.data, f"/cookies/{old_bookie_id}")
        expected_new = [replace(c, bookie_id=new_id) for c in old_cookies]
        if new_copy is not None and (
            decode_cookie_copy(new_copy.data, f"/cookies/{new_id}") != expected_new
        ):
            raise CookieMismatchError(
                f"metadata already holds a different cookie for {new_id}: another bookie "
                "uses that id; refusing to take it over"
            )
        stamped = await loop.run_in_executor(
            None, _restamp_id, config, old_cookies, old_bookie_id, new_id
        )
        if new_copy is None:
            await metadata.cookies.put(new_id, encode_cookie_copy(expected_new), expected_version=0)
        try:
            await metadata.cookies.delete(old_bookie_id, expected_version=old_copy.version)
        except MetadataVersionError:
            raise CookieMismatchError(
                f"the cookie of {old_bookie_id} changed while it was being replaced; run again"
            ) from None
    naming = await _ledgers_naming(metadata, old_bookie_id)
    return CookieUpdateReport(new_id, old_bookie_id, stamped, True, False, naming)


def _restamp_id(config: BookieConfig, old_cookies: list[Cookie], old_id: str, new_id: str) -> int:
    """Check every directory against the old cookie (or the new one, already stamped), then
    stamp the new id where it is missing; the number of directories written."""
    if len(old_cookies) != config.shard_count:
        raise CookieMismatchError(
            f"the cookie of {old_id} has {len(old_cookies)} shards, the configuration "
            f"{config.shard_count}"
        )
    todo: list[tuple[Path, Cookie]] = []
    for shard in range(config.shard_count):
        old = old_cookies[shard]
        expected_old = _expected(config, shard, bookie_id=old_id, like=old)
        problems = old.mismatches(expected_old)
        if problems:
            raise CookieMismatchError(
                f"shard {shard}: the configuration differs from the cookie of {old_id} beyond "
                f"the bookie id ({'; '.join(problems)}); update one thing at a time"
            )
        new = replace(old, bookie_id=new_id)
        for directory, found in _stamped(shard_directories(config.storage[shard])).items():
            if found == new:
                continue  # Stamped by an interrupted earlier run.
            if found is None:
                raise CookieMismatchError(
                    f"{directory} holds no cookie: a wiped or new disk cannot be re-stamped"
                )
            if found != old:
                raise CookieMismatchError(
                    f"{directory}: its cookie does not match the cookie of {old_id} in "
                    f"metadata ({'; '.join(old.mismatches(found))})"
                )
            todo.append((directory, new))
    for directory, cookie in todo:
        write_cookie(directory, cookie)
    return len(todo)


def _verify_all(config: BookieConfig, copy: bytes, bookie_id: str) -> None:
    cookies = decode_cookie_copy(copy, f"/cookies/{bookie_id}")
    for shard, cookie in enumerate(cookies):
        for directory, found in _stamped(shard_directories(config.storage[shard])).items():
            if found != cookie:
                raise CookieMismatchError(
                    f"{directory}: its cookie does not match the metadata cookie of {bookie_id}"
                )


async def update_directories(config: BookieConfig, metadata: Metadata) -> CookieUpdateReport:
    """Re-stamp the cookies of a bookie whose directories moved to the configured paths."""
    bookie_id = config.bookie_id
    await _refuse_if_registered(metadata, bookie_id)
    copy = await metadata.cookies.get(bookie_id)
    if copy is None:
        raise CookieMismatchError(
            f"metadata has no cookie for {bookie_id}: nothing to update (a new bookie gets its "
            "cookies when it first starts)"
        )
    stored = decode_cookie_copy(copy.data, f"/cookies/{bookie_id}")
    loop = asyncio.get_running_loop()
    with _journals_locked(config):
        new_cookies, stamped = await loop.run_in_executor(
            None, _restamp_directories, config, stored
        )
        updated = new_cookies != stored
        if updated:
            try:
                await metadata.cookies.put(
                    bookie_id, encode_cookie_copy(new_cookies), expected_version=copy.version
                )
            except MetadataVersionError:
                raise CookieMismatchError(
                    f"the cookie of {bookie_id} changed while it was being replaced; run again"
                ) from None
    return CookieUpdateReport(bookie_id, None, stamped, updated, not updated and not stamped, 0)


def _restamp_directories(config: BookieConfig, stored: list[Cookie]) -> tuple[list[Cookie], int]:
    if len(stored) != config.shard_count:
        raise CookieMismatchError(
            f"the metadata cookie has {len(stored)} shards, the configuration "
            f"{config.shard_count}: the shard count may not change"
        )
    todo: list[tuple[Path, Cookie]] = []
    new_cookies: list[Cookie] = []
    for shard, old in enumerate(stored):
        storage = config.storage[shard]
        new = _expected(config, shard, bookie_id=old.bookie_id, like=old)
        for kind, before, after in (
            ("journal", old.journal_dirs, new.journal_dirs),
            ("ledger", old.ledger_dirs, new.ledger_dirs),
            ("index", old.index_dirs, new.index_dirs),
        ):
            if len(before) != len(after):
                raise CookieMismatchError(
                    f"shard {shard}: {len(after)} {kind} directories configured, the cookie has "
                    f"{len(before)}; adding or removing disks is not a move"
                )
        for directory, found in _stamped(shard_directories(storage)).items():
            if found is None:
                raise CookieMismatchError(
                    f"{directory} holds no cookie: moved directories keep theirs; a wiped or "
                    "new disk cannot join this way"
                )
            if found not in (old, new):
                problems = "; ".join(old.mismatches(found))
                raise CookieMismatchError(f"{directory}: not this bookie's cookie ({problems})")
            if found != new:
                todo.append((directory, new))
        _check_disk_positions(storage.index_dirs, storage.index_map_bytes, config, shard)
        new_cookies.append(new)
    for directory, cookie in todo:
        write_cookie(directory, cookie)
    return new_cookies, len(todo)


def _check_disk_positions(
    index_dirs: tuple[Path, ...], map_bytes: int, config: BookieConfig, shard: int
) -> None:
    """Ledgers are spread over disks by position: each index must hold only its own."""
    storage = config.storage[shard]
    for position, index_dir in enumerate(index_dirs):
        if not (Path(index_dir) / INDEX_NAME).exists():
            continue
        index = LedgerIndex(Path(index_dir), map_bytes, readonly=True)
        try:
            strays = [i for i in index.states() if storage.disk_of(i) != position]
        finally:
            index.close()
        if strays:
            raise CookieMismatchError(
                f"{index_dir} holds ledger {strays[0]}, which belongs on disk "
                f"{storage.disk_of(strays[0])}, not {position}: the directories were listed in "
                "another order than before"
            )
