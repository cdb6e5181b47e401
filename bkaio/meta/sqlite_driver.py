"""The embedded metadata driver: one SQLite file, shared safely by processes on one host.

Owns the schema and the etcd-like semantics on top of it: a store-wide revision counter, a
change log that watches poll, and leases with an expiry time. Must not import `aetcd`.

- WAL mode; every write is one `BEGIN IMMEDIATE` transaction (writers queue on the database
  lock, `busy_timeout` long), so several processes can share the file.
- Every write bumps the `revision` counter once per changed key and appends the change to
  `changes`, which watches read after their last revision (polling every 50 ms, and woken at
  once by writes of the same store object).
- Leases store `expires_at` (wall clock). Whoever notices an expired lease first (any write, a
  read, a watch poll) deletes it and its keys, each deletion a change like any other.
- The change log is trimmed conservatively: only changes both older than
  `CHANGES_KEEP_SECONDS` and more than `CHANGES_KEEP_REVISIONS` behind. A watch that falls
  behind the trim point raises WatchCompactedError, as etcd does after a compaction.
- Every blocking call runs in the store's own single worker thread; the loop never waits on disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self, TypeVar

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, MetadataError, MetadataVersionError
from bkaio.meta.cluster import HOW_TO_INITIALISE, ClusterNotInitialisedError
from bkaio.meta.errors import LeaseExpiredError, WatchCompactedError
from bkaio.meta.store import (
    EventKind,
    KeyValue,
    Lease,
    MetadataStore,
    PrefixSnapshot,
    WatchEvent,
    check_key,
    prefix_end,
)
from bkaio.meta.uri import parse_sqlite_uri
from bkaio.supervision import Restart, loop_supervisor

log = structlog.get_logger(__name__)

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000  # Writers of other processes queue behind the lock this long.
# Changes by other processes are noticed by polling: one poller per store reads the revision
# counter this often and wakes every watch of the store when it moved (a watch then queries its
# prefix). While nothing changes the poller backs off to WATCH_POLL_IDLE_SECONDS, so an idle
# process stays quiet. Local writes wake the watches at once. A watch also re-queries on its
# own after WATCH_IDLE_REQUERY_SECONDS, a backstop that costs nothing measurable.
WATCH_POLL_SECONDS = 0.05
WATCH_POLL_IDLE_SECONDS = 0.4
WATCH_IDLE_REQUERY_SECONDS = 1.0
WATCH_PAGE = 1000
CHANGES_KEEP_REVISIONS = 100_000
CHANGES_KEEP_SECONDS = 600.0
TRIM_EVERY_REVISIONS = 1000

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


class SqliteLease(Lease):
    def __init__(self, store: SqliteMetadataStore, lease_id: int, ttl_seconds: float) -> None:
        super().__init__(lease_id, ttl_seconds)
        self._store = store

    async def keep_alive(self) -> None:
        await self._store._keep_alive(self.id)

    async def _revoke(self) -> None:
        await self._store._write(lambda: self._store._delete_keys_of_lease_sync(self.id))


class SqliteMetadataStore(MetadataStore):
    """`sqlite:///path/meta.db`: the single-host driver `bkaio standalone` uses."""

    def __init__(self, uri: str, *, create: bool = True) -> None:
        parsed = parse_sqlite_uri(uri)
        self.uri = uri
        self._create = create  # False: the database file must exist already.
        self._path = parsed.path
        self._root = parsed.root
        self._synchronous = parsed.synchronous
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meta-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._local_change = asyncio.Event()  # Replaced after every write: wakes watches early.
        self._pending_writes: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._writer_task: asyncio.Task[None] | None = None
        self._watches = 0  # Active watch_prefix generators; the poller runs while any is.
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, uri: str, *, create: bool = True) -> Self:
        """Open (with `create`, create if absent) the database file named by `uri`."""
        store = cls(uri, create=create)
        try:
            await store._run(store._open_sync)
        except BaseException:
            await store.close()
            raise
        return store

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, function: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, function, *args)
        except sqlite3.Error as error:
            raise MetadataError(f"metadata store {self._path}: {error}") from error

    def _open_sync(self) -> None:
        if self._create:
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            target, as_uri = self._path, False
        else:  # mode=rw: a missing file is an error, not a new empty database.
            # One leading slash: "//dir" (sqlite:////dir/meta.db) would read as an authority.
            absolute = "/" + self._path.lstrip("/")
            target, as_uri = f"file:{urllib.parse.quote(absolute)}?mode=rw", True
            if not Path(self._path).is_file():
                raise ClusterNotInitialisedError(
                    f"no bkaio cluster at metadata {self.uri.partition('?')[0]}: "
                    f"{self._path} does not exist; {HOW_TO_INITIALISE}"
                )
        conn = sqlite3.connect(
            target, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
            check_same_thread=False, uri=as_uri,
        )  # fmt: skip
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _enable_wal_sync(conn)
        conn.execute(f"PRAGMA synchronous = {self._synchronous.upper()}")
        self._conn = conn

        def create_schema() -> None:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)

        self._write_sync(create_schema, reap=False)

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

    async def _write(self, body: Callable[[], T]) -> T:
        """Run `body` in a write transaction shared with the writes queued meanwhile.

        Group commit, as etcd batches proposals: writes that arrive while a transaction is in
        the worker thread form the next one, so one fsync covers all of them. Each runs in its
        own savepoint: one failing (a lost CAS) does not undo the others.
        """
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending_writes.append((body, waiter))
        if self._writer_task is None:
            self._writer_task = asyncio.get_running_loop().create_task(self._write_batches())
        result: T = await waiter
        self._notify_local_watches()
        return result

    async def _write_batches(self) -> None:
        try:
            while self._pending_writes:
                batch, self._pending_writes = self._pending_writes, []
                try:
                    bodies = [body for body, _ in batch]
                    outcomes = await self._run(self._write_batch_sync, bodies)
                except BaseException as error:  # The commit failed: no write of the batch counts.
                    outcomes = [(False, error)] * len(batch)
                for (_, waiter), (ok, value) in zip(batch, outcomes, strict=True):
                    if waiter.done():
                        continue  # The writer was cancelled; its write may still have applied.
                    if ok:
                        waiter.set_result(value)
                    else:
                        waiter.set_exception(value)
        finally:
            self._writer_task = None

    def _write_batch_sync(self, bodies: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
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

    def _notify_local_watches(self) -> None:
        event, self._local_change = self._local_change, asyncio.Event()
        event.set()

    def _poll_sync(self) -> int:
        self._reap_if_needed_sync()  # Expired leases of dead processes must show up as deletes.
        return self._revision_sync()

    async def _poll_revisions(self) -> None:
        """The store's one poller: wakes every watch when the revision counter moved."""
        seen = -1
        pause = Backoff(WATCH_POLL_SECONDS, WATCH_POLL_IDLE_SECONDS)
        while self._watches > 0 and not self._closed:
            try:
                revision = await self._run(self._poll_sync)
            except MetadataError:
                revision = seen - 1  # Wake the watches: their own query reports the error.
            if revision != seen:
                seen = revision
                self._notify_local_watches()
                pause.reset()
            await asyncio.sleep(pause.next_delay())
        self._poller = None

    def _watch_started(self) -> None:
        self._watches += 1
        if self._poller is None:
            self._poller = loop_supervisor().spawn(
                "sqlite_watch_poller",
                self._poll_revisions,
                Restart(),
                instance=f"{self._path}#{id(self)}",
            )

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

    def _delete_keys_of_lease_sync(self, lease_id: int) -> None:
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
            self._delete_keys_of_lease_sync(lease_id)

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

    def _full(self, key: str) -> str:
        check_key(key)
        return self._root + key

    def _kv(self, row: tuple[str, bytes, int, int, int]) -> KeyValue:
        full_key, value, create_revision, mod_revision, lease = row
        return KeyValue(
            key=full_key[len(self._root) :],
            value=bytes(value),
            version=mod_revision,
            create_revision=create_revision,
            lease=lease,
        )

    # -- key/value --------------------------------------------------------------------------

    def _get_sync(self, full_key: str) -> KeyValue | None:
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

    async def get(self, key: str) -> KeyValue | None:
        return await self._run(self._get_sync, self._full(key))

    def _put_sync(self, full_key: str, value: bytes, lease_id: int, expected: int | None) -> int:
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

    async def _put(self, key: str, value: bytes, lease: Lease | None, expected: int | None) -> int:
        full_key = self._full(key)
        assert isinstance(value, bytes), type(value)
        lease_id = 0 if lease is None else lease.id
        return await self._write(lambda: self._put_sync(full_key, value, lease_id, expected))

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        return await self._put(key, value, lease, None)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        assert expected_version >= 0, expected_version
        return await self._put(key, value, lease, expected_version)

    def _delete_sync(self, full_key: str, expected: int | None) -> bool:
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

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        full_key = self._full(key)
        return await self._write(lambda: self._delete_sync(full_key, expected_version))

    def _list_sync(
        self, full_prefix: str, start_after: str | None, limit: int | None, keys_only: bool
    ) -> list[KeyValue]:
        self._reap_if_needed_sync()
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

    async def list_prefix(
        self,
        prefix: str,
        *,
        start_after: str | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> list[KeyValue]:
        assert limit is None or limit > 0, limit
        full_prefix = self._full(prefix)
        full_start = None if start_after is None else self._full(start_after)
        return await self._run(self._list_sync, full_prefix, full_start, limit, keys_only)

    def _snapshot_sync(self, full_prefix: str) -> PrefixSnapshot:
        self._reap_if_needed_sync()
        conn = self._connection()
        conn.execute("BEGIN")  # One read snapshot for the rows and the revision.
        try:
            kvs = self._list_sync(full_prefix, None, None, False)
            revision = self._revision_sync()
        finally:
            conn.execute("COMMIT")
        return PrefixSnapshot(kvs=kvs, revision=revision)

    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        return await self._run(self._snapshot_sync, self._full(prefix))

    def _revision_sync(self) -> int:
        row = (
            self._connection()
            .execute("SELECT value FROM counters WHERE name = 'revision'")
            .fetchone()
        )
        return int(row[0])

    async def current_revision(self) -> int:
        return await self._run(self._revision_sync)

    # -- leases -----------------------------------------------------------------------------

    def _grant_sync(self, ttl_seconds: float) -> int:
        cursor = self._connection().execute(
            "INSERT INTO leases (ttl_seconds, expires_at) VALUES (?, ?)",
            (ttl_seconds, time.time() + ttl_seconds),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        if not ttl_seconds > 0:
            raise MetadataError(f"lease TTL must be > 0 seconds, not {ttl_seconds}")
        lease_id = await self._write(lambda: self._grant_sync(ttl_seconds))
        return self._track_lease(SqliteLease(self, lease_id, ttl_seconds))

    async def _keep_alive(self, lease_id: int) -> None:
        def refresh() -> int:
            sql = "UPDATE leases SET expires_at = ? + ttl_seconds WHERE id = ?"
            return self._connection().execute(sql, (time.time(), lease_id)).rowcount

        if await self._write(refresh) == 0:  # Expired leases were reaped before the update.
            raise LeaseExpiredError(f"lease {lease_id} expired or was revoked")

    # -- watches ----------------------------------------------------------------------------

    def _changes_sync(
        self, full_prefix: str, after_revision: int
    ) -> tuple[list[WatchEvent], int, int]:
        """Changes under the prefix after a revision, the revision read at, the compaction."""
        self._reap_if_needed_sync()
        conn = self._connection()
        conn.execute("BEGIN")
        try:
            revision = self._revision_sync()
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

    async def watch_prefix(
        self, prefix: str, *, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        full_prefix = self._full(prefix)
        if start_revision is None:
            start_revision = await self.current_revision() + 1
        last = start_revision - 1
        self._watch_started()
        try:
            while True:
                # Taken before the query: a change committed after it sets this event.
                wake = self._local_change
                events, revision, compacted = await self._run(self._changes_sync, full_prefix, last)
                if last < compacted:
                    raise WatchCompactedError(
                        f"watch on {full_prefix}: changes after revision {last} were trimmed"
                        f" (up to {compacted}); re-read and watch again"
                    )
                for event in events:
                    yield event
                    last = event.revision
                if len(events) == WATCH_PAGE:
                    continue  # More are waiting; do not sleep.
                last = max(last, revision)  # Nothing under the prefix up to `revision`.
                await _wait_for_event(wake, WATCH_IDLE_REQUERY_SECONDS)
        finally:
            self._watches -= 1

    # -- life cycle -------------------------------------------------------------------------

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        if self._closed:
            return
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.wait((poller,))  # Never raises the poller's cancellation.
        await self._stop_keep_alives()
        if self._writer_task is not None:
            await self._writer_task  # Let queued writes finish before the connection goes.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_sync)
        self._closed = True
        self._executor.shutdown(wait=False)


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


async def _wait_for_event(event: asyncio.Event, timeout_seconds: float) -> None:
    """Wait until `event` is set or `timeout_seconds` pass, whichever is first.

    Built on asyncio.wait, which never cancels anything itself: on Python 3.11 both wait_for
    and asyncio.timeout can swallow an outside cancellation that lands just as their own
    timeout or the event fires, and a cancelled watch would then poll forever.
    """
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout_seconds)
    finally:
        waiter.cancel()
