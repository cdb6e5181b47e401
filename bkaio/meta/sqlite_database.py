"""The SQLite file behind the embedded metadata driver, and what runs on its worker thread.

Owns the schema and the etcd-like semantics on top of it (bkaio/meta/sqlite_driver.py is the
asyncio side: the worker thread, group commit, watches):

- WAL mode; every write is one `BEGIN IMMEDIATE` transaction (writers queue on the database
  lock, `busy_timeout` long), so several processes can share the file.
- Every write bumps the `revision` counter once per changed key and appends the change to
  `changes`, which watches read after their last revision.
- Leases store `expires_at` (wall clock). Whoever notices an expired lease first (any write, a
  read, a watch poll) deletes it and its keys, each deletion a change like any other.
- The change log is trimmed conservatively: only changes both older than
  `CHANGES_KEEP_SECONDS` and more than `CHANGES_KEEP_REVISIONS` behind; the `compacted` counter
  says up to where, so that a watch that fell behind it can tell.

Every method here blocks: the store calls them only on its single worker thread.
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog

from bkaio.errors import BKError, ConfigError, MetadataError, MetadataVersionError
from bkaio.meta.cluster import HOW_TO_INITIALISE, ClusterNotInitialisedError
from bkaio.meta.errors import LeaseExpiredError
from bkaio.meta.store import EventKind, KeyValue, PrefixSnapshot, WatchEvent, prefix_end
from bkaio.meta.uri import SqliteUri, shown_uri

log = structlog.get_logger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000  # Writers of other processes queue behind the lock this long.
WATCH_PAGE = 1000  # Changes one watch query returns at most.
CHANGES_KEEP_REVISIONS = 100_000
CHANGES_KEEP_SECONDS = 600.0
TRIM_EVERY_REVISIONS = 1000

_TABLES = frozenset({"kv", "changes", "leases", "counters"})  # What makes a file ours.
_KIND_CODES = {EventKind.PUT: 0, EventKind.DELETE: 1}
_CODE_KINDS = {code: kind for kind, code in _KIND_CODES.items()}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL,
    lease INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_lease ON kv(lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS changes (
    revision INTEGER PRIMARY KEY,
    kind INTEGER NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    ctime REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ttl_seconds REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases(expires_at);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('revision', 1), ('compacted', 0);
"""


class SqliteDatabase:
    """One connection to the metadata database file, used from one thread at a time."""

    def __init__(self, uri: str, parsed: SqliteUri, *, create: bool) -> None:
        self.uri = uri
        self._create = create  # False: the database file must exist already.
        self._path = parsed.path
        self._root = parsed.root
        self._synchronous = parsed.synchronous
        self._conn: sqlite3.Connection | None = None

    def open_sync(self) -> None:
        if Path(self._path).is_dir():  # Else "does not exist", or SQLite's "unable to open".
            raise ConfigError(
                f"metadata {shown_uri(self.uri)}: {self._path} is a directory, not a database "
                f"file; name a file in it (sqlite://{self._path}/meta.db) or check the path"
            )
        if self._create:
            try:
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:  # A file where a directory should be, no permission.
                raise ConfigError(
                    f"metadata {shown_uri(self.uri)}: cannot make the directory of {self._path}:"
                    f" {error.strerror}: {error.filename}; check the path"
                ) from error
            target, as_uri = self._path, False
        else:  # mode=rw: a missing file is an error, not a new empty database.
            # The path has one leading slash (parse_sqlite_uri): "//dir" would be an authority.
            target, as_uri = f"file:{urllib.parse.quote(self._path)}?mode=rw", True
            if not Path(self._path).is_file():
                raise ClusterNotInitialisedError(
                    f"no bkaio cluster at metadata {shown_uri(self.uri)}: "
                    f"{self._path} does not exist; {HOW_TO_INITIALISE}"
                )
        conn = sqlite3.connect(
            target, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
            check_same_thread=False, uri=as_uri,
        )  # fmt: skip
        self._conn = conn  # Closed by close_sync should the rest of opening fail.
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # Judged before WAL mode: switching a file to it writes a header even into an empty one.
        self._check_schema_sync()
        _enable_wal_sync(conn)
        conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")

        def create_schema() -> None:
            self._check_schema_sync()  # Again, in the transaction: another process may create.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

        self._write_sync(create_schema, reap=False)

    def _check_schema_sync(self) -> None:
        """Refuse a file that holds no bkaio schema unless `create` (and then one holding
        anything else): only commands that create a cluster make a new database, and a mistyped
        path, read-only or not, must change nothing in a file that is not one."""
        names = sorted(
            name
            for (name,) in self._connection().execute("SELECT name FROM sqlite_master")
            if not name.startswith("sqlite_")  # SQLite's own (sqlite_sequence, autoindexes).
        )
        if _TABLES.issubset(names):
            return
        shown, path = shown_uri(self.uri), self._path
        if names:
            listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise ConfigError(
                f"metadata {shown}: {path} is not a bkaio metadata database (it holds {listed});"
                " nothing was written to it; check the path"
            )
        if not self._create:
            raise ClusterNotInitialisedError(
                f"no bkaio cluster at metadata {shown}: {path} is not a bkaio metadata database"
                f" (no schema); nothing was written to it; {HOW_TO_INITIALISE}"
            )

    def _connection(self) -> sqlite3.Connection:
        assert self._conn is not None, "store used before open()"
        return self._conn

    def _write_sync(self, body: Callable[[], T], *, reap: bool = True) -> T:
        """Run `body` in one IMMEDIATE transaction, after reaping expired leases."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if reap:
                self._expire_leases_sync(time.time())
            result = body()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    def write_batch_sync(self, bodies: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        conn = self._connection()

        def run_all() -> list[tuple[bool, Any]]:
            outcomes: list[tuple[bool, Any]] = []
            for body in bodies:
                conn.execute("SAVEPOINT one_write")
                try:
                    outcomes.append((True, body()))
                except BKError as error:
                    conn.execute("ROLLBACK TO one_write")
                    outcomes.append((False, error))
                except sqlite3.Error as error:
                    conn.execute("ROLLBACK TO one_write")
                    outcomes.append((False, MetadataError(f"metadata store {self._path}: {error}")))
                conn.execute("RELEASE one_write")
            return outcomes

        return self._write_sync(run_all)

    def poll_sync(self) -> int:
        self._reap_if_needed_sync()  # Expired leases of dead processes must show up as deletes.
        return self.revision_sync()

    def _next_revision_sync(self) -> int:
        row = (
            self._connection()
            .execute(
                "UPDATE counters SET value = value + 1 WHERE name = 'revision' RETURNING value"
            )
            .fetchone()
        )
        revision = int(row[0])
        if revision % TRIM_EVERY_REVISIONS == 0:
            self._trim_changes_sync(revision)
        return revision

    def _trim_changes_sync(self, revision: int) -> None:
        conn = self._connection()
        cutoff = conn.execute(
            "SELECT MAX(revision) FROM changes WHERE revision <= ? AND ctime < ?",
            (revision - CHANGES_KEEP_REVISIONS, time.time() - CHANGES_KEEP_SECONDS),
        ).fetchone()[0]
        if cutoff is not None:
            conn.execute("DELETE FROM changes WHERE revision <= ?", (cutoff,))
            conn.execute("UPDATE counters SET value = ? WHERE name = 'compacted'", (cutoff,))

    def _record_sync(self, revision: int, kind: EventKind, full_key: str, value: bytes) -> None:
        self._connection().execute(
            "INSERT INTO changes (revision, kind, key, value, ctime) VALUES (?, ?, ?, ?, ?)",
            (revision, _KIND_CODES[kind], full_key, value, time.time()),
        )

    def delete_keys_of_lease_sync(self, lease_id: int) -> None:
        conn = self._connection()
        keys = [row[0] for row in conn.execute("SELECT key FROM kv WHERE lease = ?", (lease_id,))]
        for full_key in keys:
            conn.execute("DELETE FROM kv WHERE key = ?", (full_key,))
            self._record_sync(self._next_revision_sync(), EventKind.DELETE, full_key, b"")
        conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))

    def _expire_leases_sync(self, now: float) -> None:
        expired = (
            self._connection()
            .execute("SELECT id FROM leases WHERE expires_at <= ? ORDER BY id", (now,))
            .fetchall()
        )
        for (lease_id,) in expired:
            log.info("lease_expired", lease_id=lease_id, store=self._path)
            self.delete_keys_of_lease_sync(lease_id)

    def _reap_if_needed_sync(self) -> None:
        """Reads call this first: an expired lease's keys must not be seen."""
        now = time.time()
        found = (
            self._connection()
            .execute("SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1", (now,))
            .fetchone()
        )
        if found is not None:
            self._write_sync(lambda: None)

    def _kv(self, row: tuple[str, bytes, int, int, int]) -> KeyValue:
        full_key, value, create_revision, mod_revision, lease = row
        return KeyValue(
            key=full_key[len(self._root) :],
            value=bytes(value),
            version=mod_revision,
            create_revision=create_revision,
            lease=lease,
        )

    def get_sync(self, full_key: str) -> KeyValue | None:
        self._reap_if_needed_sync()
        row = (
            self._connection()
            .execute(
                "SELECT key, value, create_revision, mod_revision, lease FROM kv WHERE key = ?",
                (full_key,),
            )
            .fetchone()
        )
        return None if row is None else self._kv(row)

    def put_sync(self, full_key: str, value: bytes, lease_id: int, expected: int | None) -> int:
        conn = self._connection()
        row = conn.execute("SELECT mod_revision FROM kv WHERE key = ?", (full_key,)).fetchone()
        current = 0 if row is None else int(row[0])
        if expected is not None and current != expected:
            raise MetadataVersionError(
                f"metadata key {full_key}: version is {current}, expected {expected}"
            )
        if lease_id:
            alive = conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease_id,)).fetchone()
            if alive is None:
                raise LeaseExpiredError(f"lease {lease_id} expired; cannot put {full_key}")
        revision = self._next_revision_sync()
        conn.execute(
            "INSERT INTO kv (key, value, create_revision, mod_revision, lease)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value,"
            " mod_revision = excluded.mod_revision, lease = excluded.lease",
            (full_key, value, revision, revision, lease_id),
        )
        self._record_sync(revision, EventKind.PUT, full_key, value)
        return revision

    def delete_sync(self, full_key: str, expected: int | None) -> bool:
        conn = self._connection()
        row = conn.execute("SELECT mod_revision FROM kv WHERE key = ?", (full_key,)).fetchone()
        if row is None:
            return False
        if expected is not None and int(row[0]) != expected:
            raise MetadataVersionError(
                f"metadata key {full_key}: version is {row[0]}, expected {expected}; not deleted"
            )
        conn.execute("DELETE FROM kv WHERE key = ?", (full_key,))
        self._record_sync(self._next_revision_sync(), EventKind.DELETE, full_key, b"")
        return True

    def list_sync(
        self, full_prefix: str, start_after: str | None, limit: int | None, keys_only: bool
    ) -> list[KeyValue]:
        self._reap_if_needed_sync()
        return self._rows_sync(full_prefix, start_after, limit, keys_only)

    def _rows_sync(
        self, full_prefix: str, start_after: str | None, limit: int | None, keys_only: bool
    ) -> list[KeyValue]:
        lower, operator = (full_prefix, ">=") if start_after is None else (start_after, ">")
        value_column = "x''" if keys_only else "value"
        rows = (
            self._connection()
            .execute(
                f"SELECT key, {value_column}, create_revision, mod_revision, lease FROM kv"
                f" WHERE key {operator} ? AND key < ? ORDER BY key LIMIT ?",
                (lower, prefix_end(full_prefix), -1 if limit is None else limit),
            )
            .fetchall()
        )
        return [self._kv(row) for row in rows]

    def snapshot_sync(self, full_prefix: str) -> PrefixSnapshot:
        self._reap_if_needed_sync()
        conn = self._connection()
        conn.execute("BEGIN")  # One read snapshot for the rows and the revision.
        try:
            # Not list_sync: a lease found expired now would be reaped in a write transaction,
            # which cannot start inside this one (the snapshot failed).
            kvs = self._rows_sync(full_prefix, None, None, False)
            revision = self.revision_sync()
        finally:
            conn.execute("COMMIT")
        return PrefixSnapshot(kvs=kvs, revision=revision)

    def revision_sync(self) -> int:
        row = (
            self._connection()
            .execute("SELECT value FROM counters WHERE name = 'revision'")
            .fetchone()
        )
        return int(row[0])

    def grant_sync(self, ttl_seconds: float) -> int:
        cursor = self._connection().execute(
            "INSERT INTO leases (ttl_seconds, expires_at) VALUES (?, ?)",
            (ttl_seconds, time.time() + ttl_seconds),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def refresh_lease_sync(self, lease_id: int) -> int:
        """Extend the lease by its TTL from now; 0 when it is gone (expired or revoked)."""
        sql = "UPDATE leases SET expires_at = ? + ttl_seconds WHERE id = ?"
        return self._connection().execute(sql, (time.time(), lease_id)).rowcount

    def changes_sync(
        self, full_prefix: str, after_revision: int
    ) -> tuple[list[WatchEvent], int, int]:
        """Changes under the prefix after a revision, the revision read at, the compaction."""
        self._reap_if_needed_sync()
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            revision = self.revision_sync()
            compacted = int(
                conn.execute("SELECT value FROM counters WHERE name = 'compacted'").fetchone()[0]
            )
            rows = conn.execute(
                "SELECT revision, kind, key, value FROM changes WHERE revision > ?"
                " AND key >= ? AND key < ? ORDER BY revision LIMIT ?",
                (after_revision, full_prefix, prefix_end(full_prefix), WATCH_PAGE),
            ).fetchall()
        finally:
            conn.execute("COMMIT")
        events = [
            WatchEvent(
                kind=_CODE_KINDS[kind],
                key=full_key[len(self._root) :],
                value=bytes(value),
                revision=change_revision,
            )
            for change_revision, kind, full_key, value in rows
        ]
        return events, revision, compacted

    def close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _enable_wal_sync(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL mode, waiting out other processes doing the same.

    Changing the journal mode needs the file to itself, and SQLite reports "database is
    locked" at once, without its busy handler, when another process is opening the same new
    file at that moment (bookies of one standalone cluster start together). Retry until the
    busy timeout instead; once any process has switched the file, the mode sticks.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)  # On the store's worker thread, never the event loop.
        pause = min(pause * 2, 0.1)
