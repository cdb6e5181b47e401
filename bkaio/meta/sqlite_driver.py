"""The embedded metadata driver: one SQLite file, shared safely by processes on one host.

The asyncio side of the driver: the store's single worker thread (every blocking call runs
there; the loop never waits on disk), group commit of the writes queued meanwhile, leases, and
watches. The schema and the etcd-like semantics on top of it (a store-wide revision counter, a
change log, leases with an expiry time, trimming) are bkaio/meta/sqlite_database.py's. Must
not import `aetcd`.

Watches read the change log after their last revision: polled every 50 ms by one poller per
store, and woken at once by writes of the same store object. A watch that falls behind the
change log's trim point raises WatchCompactedError, as etcd does after a compaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self, TypeVar

from bkaio.backoff import Backoff
from bkaio.errors import MetadataError
from bkaio.meta.errors import LeaseExpiredError, WatchCompactedError
from bkaio.meta.sqlite_database import WATCH_PAGE, SqliteDatabase
from bkaio.meta.store import (
    KeyValue,
    Lease,
    MetadataStore,
    PrefixSnapshot,
    WatchEvent,
    check_key,
)
from bkaio.meta.uri import parse_sqlite_uri
from bkaio.supervision import Restart, loop_supervisor

T = TypeVar("T")

# Changes by other processes are noticed by polling: one poller per store reads the revision
# counter this often and wakes every watch of the store when it moved (a watch then queries its
# prefix). While nothing changes the poller backs off to WATCH_POLL_IDLE_SECONDS, so an idle
# process stays quiet. Local writes wake the watches at once. A watch also re-queries on its
# own after WATCH_IDLE_REQUERY_SECONDS, a backstop that costs nothing measurable.
WATCH_POLL_SECONDS = 0.05
WATCH_POLL_IDLE_SECONDS = 0.4
WATCH_IDLE_REQUERY_SECONDS = 1.0


class SqliteLease(Lease):
    def __init__(
        self, store: SqliteMetadataStore, lease_id: int, ttl_seconds: float, requested_at: float
    ) -> None:
        super().__init__(lease_id, ttl_seconds, requested_at=requested_at)
        self._store = store

    async def keep_alive(self) -> None:
        await self._store._keep_alive(self.id)

    async def _revoke(self) -> None:
        await self._store._write(lambda: self._store._database.delete_keys_of_lease_sync(self.id))


class SqliteMetadataStore(MetadataStore):
    """`sqlite:///path/meta.db`: the single-host driver `bkaio standalone` uses."""

    def __init__(self, uri: str, *, create: bool = True) -> None:
        parsed = parse_sqlite_uri(uri)
        self.uri = uri
        self._path = parsed.path
        self._root = parsed.root
        self._database = SqliteDatabase(uri, parsed, create=create)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="meta-sqlite")
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
            await store._run(store._database.open_sync)
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
                    outcomes = await self._run(self._database.write_batch_sync, bodies)
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

    def _notify_local_watches(self) -> None:
        event, self._local_change = self._local_change, asyncio.Event()
        event.set()

    async def _poll_revisions(self) -> None:
        """The store's one poller: wakes every watch when the revision counter moved."""
        seen = -1
        pause = Backoff(WATCH_POLL_SECONDS, WATCH_POLL_IDLE_SECONDS)
        while self._watches > 0 and not self._closed:
            try:
                revision = await self._run(self._database.poll_sync)
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

    def _full(self, key: str) -> str:
        check_key(key)
        return self._root + key

    # -- key/value --------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        return await self._run(self._database.get_sync, self._full(key))

    async def _put(self, key: str, value: bytes, lease: Lease | None, expected: int | None) -> int:
        full_key = self._full(key)
        assert isinstance(value, bytes), type(value)
        lease_id = 0 if lease is None else lease.id
        return await self._write(
            lambda: self._database.put_sync(full_key, value, lease_id, expected)
        )

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        return await self._put(key, value, lease, None)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        assert expected_version >= 0, expected_version
        return await self._put(key, value, lease, expected_version)

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        full_key = self._full(key)
        return await self._write(lambda: self._database.delete_sync(full_key, expected_version))

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
        return await self._run(self._database.list_sync, full_prefix, full_start, limit, keys_only)

    async def snapshot_prefix(self, prefix: str) -> PrefixSnapshot:
        return await self._run(self._database.snapshot_sync, self._full(prefix))

    async def current_revision(self) -> int:
        return await self._run(self._database.revision_sync)

    # -- leases -----------------------------------------------------------------------------

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        if not ttl_seconds > 0:
            raise MetadataError(f"lease TTL must be > 0 seconds, not {ttl_seconds}")
        requested_at = asyncio.get_running_loop().time()
        lease_id = await self._write(lambda: self._database.grant_sync(ttl_seconds))
        return self._track_lease(SqliteLease(self, lease_id, ttl_seconds, requested_at))

    async def _keep_alive(self, lease_id: int) -> None:
        # Expired leases were reaped before the update.
        if await self._write(lambda: self._database.refresh_lease_sync(lease_id)) == 0:
            raise LeaseExpiredError(f"lease {lease_id} expired or was revoked")

    # -- watches ----------------------------------------------------------------------------

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
                events, revision, compacted = await self._run(
                    self._database.changes_sync, full_prefix, last
                )
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
        # Closed before the connection goes: a call made meanwhile (a watch, another task)
        # fails as on a closed store, rather than reaching the connection after it is gone.
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._database.close_sync)
        self._executor.shutdown(wait=False)


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
