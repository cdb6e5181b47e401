"""Cookies: the identity stamp in every journal, ledger and index directory of a bookie shard.

A `COOKIE` file binds a directory to (bookie id, shard index, shard count, the full directory
set, instance id, and the cluster's instance id). Opening storage checks every directory: a cookie
that disagrees, a directory
with data but no cookie, or a wiped disk next to stamped ones refuses to start with
`CookieMismatchError`, so a swapped or wiped disk never rejoins silently (BookKeeper's
`InvalidCookieException`). A fresh bookie (every directory empty) gets new cookies. The same
`Cookie` serializes with `to_bytes`/`from_bytes` so the bookie can also keep a copy in metadata.

Blocking file I/O: callers run `verify_or_stamp` in an executor.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bkaio.errors import CookieMismatchError

COOKIE_FILE = "COOKIE"
COOKIE_LAYOUT_VERSION = 1
# Entries a fresh filesystem may already hold; they do not make a directory "used".
_IGNORED_NAMES = frozenset({"lost+found", ".DS_Store"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Cookie:
    bookie_id: str
    shard_index: int
    shard_count: int
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    index_dirs: tuple[str, ...]
    # This stamping's incarnation (a new one each time empty directories are stamped): it tells
    # a reformatted bookie from the one ledgers remember (limbo, bkaio/bookie/limbo.py).
    instance_id: str
    # The metadata cluster's `/instanceid` when the directories were stamped (BookKeeper's
    # Cookie.instanceId): a bookie whose directories name another cluster must not join this
    # one, whose ledger ids may repeat the old one's. "" in cookies written before bkaio
    # recorded it, and where no cluster is known (storage opened on its own).
    cluster_instance_id: str = ""
    layout_version: int = COOKIE_LAYOUT_VERSION

    def to_bytes(self) -> bytes:
        body = {
            "layout_version": self.layout_version,
            "bookie_id": self.bookie_id,
            "shard_index": self.shard_index,
            "shard_count": self.shard_count,
            "journal_dirs": list(self.journal_dirs),
            "ledger_dirs": list(self.ledger_dirs),
            "index_dirs": list(self.index_dirs),
            "instance_id": self.instance_id,
        }
        if self.cluster_instance_id:  # Absent, like in the cookies written before it existed.
            body["cluster_instance_id"] = self.cluster_instance_id
        return json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "cookie") -> Cookie:
        try:
            body: Any = json.loads(data)
            cookie = cls(
                layout_version=int(body["layout_version"]),
                bookie_id=str(body["bookie_id"]),
                shard_index=int(body["shard_index"]),
                shard_count=int(body["shard_count"]),
                journal_dirs=tuple(str(d) for d in body["journal_dirs"]),
                ledger_dirs=tuple(str(d) for d in body["ledger_dirs"]),
                index_dirs=tuple(str(d) for d in body["index_dirs"]),
                instance_id=str(body["instance_id"]),
                cluster_instance_id=str(body.get("cluster_instance_id", "")),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise CookieMismatchError(f"{where}: unreadable cookie ({error!r})") from error
        if cookie.layout_version != COOKIE_LAYOUT_VERSION:
            raise CookieMismatchError(
                f"{where}: cookie layout version {cookie.layout_version}, this bookie writes "
                f"{COOKIE_LAYOUT_VERSION}"
            )
        return cookie

    def mismatches(self, other: Cookie) -> list[str]:
        """Fields where `other` differs from this cookie, as `name: ours != theirs`."""
        names = (
            *("bookie_id", "shard_index", "shard_count"),
            *("journal_dirs", "ledger_dirs", "index_dirs", "instance_id", "cluster_instance_id"),
        )
        return [
            f"{name}: expected {getattr(self, name)!r}, found {getattr(other, name)!r}"
            for name in names
            if getattr(self, name) != getattr(other, name)
        ]


def expected_cookie(
    *,
    bookie_id: str,
    shard_index: int,
    shard_count: int,
    journal_dirs: Sequence[Path],
    ledger_dirs: Sequence[Path],
    index_dirs: Sequence[Path],
    instance_id: str = "",
    cluster_instance_id: str = "",
) -> Cookie:
    """The cookie this configuration should find; `instance_id` (and `cluster_instance_id`)
    left empty are filled in by verification."""
    return Cookie(
        bookie_id=bookie_id,
        shard_index=shard_index,
        shard_count=shard_count,
        journal_dirs=tuple(str(Path(d).resolve()) for d in journal_dirs),
        ledger_dirs=tuple(str(Path(d).resolve()) for d in ledger_dirs),
        index_dirs=tuple(str(Path(d).resolve()) for d in index_dirs),
        instance_id=instance_id,
        cluster_instance_id=cluster_instance_id,
    )


def read_cookie(directory: Path) -> Cookie | None:
    path = directory / COOKIE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return Cookie.from_bytes(data, where=str(path))


def write_cookie(directory: Path, cookie: Cookie) -> None:
    """Atomically (temp file, fsync, rename, fsync the directory)."""
    temporary = directory / (COOKIE_FILE + ".tmp")
    with open(temporary, "wb") as file:
        file.write(cookie.to_bytes())
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / COOKIE_FILE)
    fsync_directory(directory)


def fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _is_empty(directory: Path) -> bool:
    return all(
        name in _IGNORED_NAMES or name == COOKIE_FILE + ".tmp" for name in os.listdir(directory)
    )


def verify_or_stamp(expected: Cookie, directories: Sequence[Path]) -> Cookie:
    """Check the cookie of every directory against `expected`, or stamp a fresh set.

    Returns the cookie in force (with its instance ids). `expected.instance_id` and
    `expected.cluster_instance_id` may each be empty (accept whatever the directories agree on)
    or set (for example from the metadata copy); whether the cluster is the right one is the
    bookie's check (bkaio/bookie/cookies.py), which knows the cluster.
    """
    found: dict[Path, Cookie] = {}
    empty: list[Path] = []
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
        cookie = read_cookie(directory)
        if cookie is not None:
            found[directory] = cookie
        elif _is_empty(directory):
            empty.append(directory)
        else:
            raise CookieMismatchError(
                f"{directory} holds data but no {COOKIE_FILE}: it belongs to another bookie or "
                "was copied in by hand; refusing to start"
            )
    if not found:
        instance_id = expected.instance_id or uuid.uuid4().hex
        cookie = replace(expected, instance_id=instance_id)
        for directory in directories:
            write_cookie(directory, cookie)
        return cookie
    if empty:
        stamped = ", ".join(str(d) for d in found)
        raise CookieMismatchError(
            f"{', '.join(str(d) for d in empty)} has no {COOKIE_FILE} while {stamped} has one: "
            "a wiped or replaced disk must not rejoin silently; refusing to start"
        )
    first_directory, first = next(iter(found.items()))
    reference = replace(
        expected,
        instance_id=expected.instance_id or first.instance_id,
        cluster_instance_id=expected.cluster_instance_id or first.cluster_instance_id,
    )
    for directory, cookie in found.items():
        problems = reference.mismatches(cookie)
        if problems:
            raise CookieMismatchError(
                f"{directory / COOKIE_FILE} does not match this bookie "
                f"(compared with {first_directory / COOKIE_FILE} and the configuration): "
                + "; ".join(problems)
            )
    return reference
