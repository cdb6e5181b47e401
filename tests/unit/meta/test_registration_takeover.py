"""A bookie's registration, put back after a lost lease or moved between modes, never overwrites
a record another process registered under the same bookie id: it waits it out (2 x TTL), then
the registration is lost for good (a fatal task failure: the bookie stops)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from bkaio.errors import MetadataError
from bkaio.meta.bookies import (
    BookieInfo,
    BookieRegistration,
    BookieRegistry,
    decode_bookie_info,
    encode_bookie_info,
    registration_key,
)
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.meta.store import EventKind, Lease
from bkaio.supervision import Supervisor

TTL = 1.0  # The other process's record is waited out for 2 s.
INFO = BookieInfo.for_address("127.0.0.1", 3181, version="first")
OTHER = BookieInfo.for_address("127.0.0.1", 3181, version="second")  # A copied config.
WRITABLE = registration_key(INFO.bookie_id, read_only=False)
READ_ONLY = registration_key(INFO.bookie_id, read_only=True)


class FakeInterleavingStore(SqliteMetadataStore):
    """Runs `before_next_grant` (once) when a lease is asked for, before granting it: what
    another process does meanwhile. While `grants_fail`, no lease is granted (unreachable).
    The next `unconfirmed_cas` conditional writes are applied and then reported as of unknown
    outcome (the connection broke with the answer in flight); the `refused_cas` after them fail
    unapplied (unreachable)."""

    before_next_grant: Callable[[], Awaitable[None]] | None = None
    unconfirmed_cas = 0
    refused_cas = 0
    grants_fail = False

    async def grant_lease(self, ttl_seconds: float) -> Lease:
        if self.grants_fail:
            raise MetadataError("grant a lease: store unreachable (fake)")
        meanwhile, self.before_next_grant = self.before_next_grant, None
        if meanwhile is not None:
            await meanwhile()
        return await super().grant_lease(ttl_seconds)

    async def compare_and_swap(
        self, key: str, value: bytes, *, expected_version: int, lease: Lease | None = None
    ) -> int:
        if self.unconfirmed_cas == 0 and self.refused_cas > 0:
            self.refused_cas -= 1
            raise MetadataError(f"put {key}: store unreachable (fake)")
        version = await super().compare_and_swap(
            key, value, expected_version=expected_version, lease=lease
        )
        if self.unconfirmed_cas > 0:
            self.unconfirmed_cas -= 1
            raise MetadataOutcomeUnknownError(f"put {key}: connection lost (fake)")
        return version


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[FakeInterleavingStore]:
    opened = await FakeInterleavingStore.open(f"sqlite://{tmp_path}/meta.db")
    yield opened
    await opened.close()


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    """The bookie's supervisor: registration keepers report to it."""
    supervisor = Supervisor("bookie", registry=CollectorRegistry())
    supervisor.adopt_loop()
    yield supervisor
    await supervisor.stop()


def _failures(supervisor: Supervisor, task: str) -> int:
    return sum(status.failures for status in supervisor if status.name == task)


async def _until(condition: Callable[[], bool], what: str, timeout_seconds: float = 20.0) -> None:
    """Poll until `condition` holds; a liveness bound only (TimeoutError naming `what`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_seconds
    while True:
        if condition():
            return
        if loop.time() >= deadline:
            raise TimeoutError(f"not within {timeout_seconds} s: {what}")
        await asyncio.sleep(0.01)


async def _other_registers_while_the_lease_is_lost(
    store: FakeInterleavingStore,
) -> tuple[BookieRegistration, list[BookieRegistration]]:
    """Our registration, whose lease is then lost; the other process registers the same id
    just before our keeper gets its new lease."""
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=TTL)
    others: list[BookieRegistration] = []

    async def other_registers() -> None:
        others.append(await BookieRegistry(store).register(OTHER, ttl_seconds=TTL))

    store.before_next_grant = other_registers
    await registration.lease.revoke()  # Lost, as after an outage longer than the TTL.
    return registration, others


async def test_a_record_registered_meanwhile_by_another_process_is_not_overwritten(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    with capture_logs() as logs:
        registration, others = await _other_registers_while_the_lease_is_lost(store)
        # The other record is waited out for 2 x TTL (2 s), then the registration given up.
        await _until(supervisor.fatal.done, "the registration given up as taken")
        failure = supervisor.fatal.result()
    (other,) = others
    kv = await store.get(WRITABLE)
    assert kv is not None and kv.lease == other.lease.id
    assert decode_bookie_info(kv).version == "second"  # Never replaced by ours.
    assert await store.get(READ_ONLY) is None
    assert failure.task == "bookie_registration"
    message = str(failure.error)
    assert INFO.bookie_id in message and WRITABLE in message and str(other.lease.id) in message
    assert _failures(supervisor, "bookie_registration") == 1
    (failed,) = [entry for entry in logs if entry["event"] == "task_failed"]
    assert failed["log_level"] == "error" and WRITABLE in failed["error"]
    assert not registration.registered
    await registration.deregister()  # As the bookie's stop does: the other record stays.
    kv = await store.get(WRITABLE)
    assert kv is not None and kv.lease == other.lease.id
    await other.deregister()


async def test_a_record_of_another_process_that_goes_within_2_ttl_is_waited_out(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    start = await store.current_revision() + 1
    with capture_logs() as logs:
        registration, others = await _other_registers_while_the_lease_is_lost(store)
        await _until(
            lambda: any(e["event"] == "bookie_registration_held_by_another" for e in logs),
            "the keeper waiting for the other record",
        )
        (other,) = others
        await other.deregister()  # A previous incarnation ending within the wait.
        await _until(lambda: registration.registered, "registered again")
    kv = await store.get(WRITABLE)
    assert kv is not None and kv.lease == registration.lease.id
    assert decode_bookie_info(kv).version == "first"
    assert not supervisor.fatal.done()
    # The other record was there until it went: ours came back only after its delete.
    kinds = []
    async for event in store.watch_prefix(WRITABLE, start_revision=start):
        kinds.append(event.kind)
        if len(kinds) == 5:  # Ours put and dropped, theirs put and dropped, ours put.
            break
    put, delete = EventKind.PUT, EventKind.DELETE
    assert kinds == [put, delete, put, delete, put]
    await registration.deregister()


async def test_a_record_written_by_an_unconfirmed_attempt_counts_as_ours(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    """A re-registration whose write was applied but not confirmed is resolved by reading the
    record back (bkaio/meta/conditional.py): ours, under the attempt's lease, so the keeper is
    registered again at once, not waiting the record out as another process's."""
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=TTL)
    store.unconfirmed_cas = 1
    with capture_logs() as logs:
        await registration.lease.revoke()
        await _until(lambda: registration.registered, "registered again")
    kv = await store.get(WRITABLE)
    assert kv is not None and kv.lease == registration.lease.id
    assert not supervisor.fatal.done()
    # Not taken for another process's record (that would be waited out until it expired).
    assert not [e for e in logs if e["event"] == "bookie_registration_held_by_another"]
    assert not [e for e in logs if e["event"] == "bookie_reregister_failed"]
    assert store.unconfirmed_cas == 0
    await registration.deregister()
    assert await store.get(WRITABLE) is None


async def _theirs_at_read_only(store: FakeInterleavingStore) -> tuple[Lease, bytes]:
    """Another process's record under our read-only key (a bookie of an older version that
    overwrote, say), its lease kept alive."""
    theirs = await store.grant_lease(TTL)
    theirs.start_keep_alive()
    record = encode_bookie_info(OTHER)
    await store.compare_and_swap(READ_ONLY, record, expected_version=0, lease=theirs)
    return theirs, record


async def test_a_mode_move_waits_out_the_record_of_another_process(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=TTL)
    theirs, theirs_record = await _theirs_at_read_only(store)
    with capture_logs() as logs:
        move = asyncio.ensure_future(registration.set_read_only(True))
        await _until(
            lambda: any(e["event"] == "bookie_registration_held_by_another" for e in logs),
            "the move waiting for the other record",
        )
        kv = await store.get(READ_ONLY)
        assert kv is not None and kv.lease == theirs.id and kv.value == theirs_record
        mine = await store.get(WRITABLE)
        assert mine is not None and mine.lease == registration.lease.id  # Listed as before.
        await theirs.revoke()  # The other record goes within 2 x TTL: the move is made.
        await asyncio.wait_for(move, 20)
    kv = await store.get(READ_ONLY)
    assert kv is not None and kv.lease == registration.lease.id
    assert await store.get(WRITABLE) is None
    assert not supervisor.fatal.done()
    await registration.deregister()


async def test_a_mode_move_meeting_another_process_for_2_ttl_ends_fatal_not_retried(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    """As re-registration: the registration is lost for good (the bookie stops, exit 3), and
    the mode keeper's later calls do not start over (they found a retry loop before)."""
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=TTL)
    theirs, theirs_record = await _theirs_at_read_only(store)
    with capture_logs() as logs:
        await asyncio.wait_for(registration.set_read_only(True), 20)  # Ends; no error.
        assert supervisor.fatal.done()
        failure = supervisor.fatal.result()
        assert failure.task == "bookie_registration"
        message = str(failure.error)
        assert INFO.bookie_id in message and READ_ONLY in message and str(theirs.id) in message
        assert not registration.registered
        await registration.set_read_only(False)  # The mode keeper again: only recorded.
        await registration.set_read_only(True)
    assert _failures(supervisor, "bookie_registration") == 1
    assert len([e for e in logs if e["event"] == "bookie_registration_held_by_another"]) == 1
    kv = await store.get(READ_ONLY)
    assert kv is not None and kv.lease == theirs.id and kv.value == theirs_record
    await registration.deregister()  # As the bookie's stop does: the other record stays.
    assert await store.get(WRITABLE) is None and await store.get(READ_ONLY) is not None
    await theirs.revoke()


async def test_a_mode_change_while_the_registration_is_lost_is_made_by_registering_again(
    store: FakeInterleavingStore, supervisor: Supervisor
) -> None:
    registration = await BookieRegistry(store).register(INFO, ttl_seconds=TTL)
    store.grants_fail = True  # Metadata unreachable: the record cannot come back yet.
    await registration.lease.revoke()
    await registration.set_read_only(True)  # Lost: nothing to move, the mode is remembered.
    assert not registration.registered
    store.grants_fail = False
    await _until(lambda: registration.registered, "registered again")
    kv = await store.get(READ_ONLY)
    assert kv is not None and kv.lease == registration.lease.id
    assert await store.get(WRITABLE) is None
    await registration.deregister()
