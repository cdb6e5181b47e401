"""etcd watches that outlive connections and members.

A watch re-opens after any connection error from the revision after the last event it
delivered, so no event is lost or repeated; only an etcd compaction past that revision ends it
(WatchCompactedError). When its member is lost (bkaio/meta/etcd_connection.py moves requests to
the next one and cancels the watch calls open on the old one), it re-opens on the new member at
once. A member that lost its leader (cut off from the others) ends the watches opened with
etcd's require-leader flag, which they all are, and they re-open on the next member. A member
that is partitioned or stopped keeps its connections open and answers nothing:
a watch that hears nothing for WATCH_IDLE_SECONDS asks the member for a progress report, and
moves on when none comes for WATCH_SILENT_PERIODS such periods (tests/integration/meta/
test_etcd_cluster.py stops a member under a watch).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from aetcd import rpc

from bkaio.backoff import Backoff
from bkaio.errors import MetadataError
from bkaio.meta.errors import WatchCompactedError
from bkaio.meta.etcd_connection import (
    MAX_BACKOFF_SECONDS,
    MIN_BACKOFF_SECONDS,
    EtcdConnection,
    connection_lost,
)
from bkaio.meta.store import EventKind, WatchEvent, check_key, prefix_end
from bkaio.supervision import loop_supervisor

log = structlog.get_logger(__name__)

# A watch that has received nothing for this long asks for a progress report; after three
# such periods without any answer its member counts as lost.
WATCH_IDLE_SECONDS = 2.0
WATCH_SILENT_PERIODS = 3
# Asks the member to end the watch (UNAVAILABLE, "no leader") once it has had no leader for a
# few election timeouts. Without it a member cut off from the others keeps the stream open and
# answers progress requests itself, so the watch looks healthy while it misses every change
# the rest of the cluster makes (etcd's own client sets it for the same reason).
_REQUIRE_LEADER = ("hasleader", "true")
# Codes of a watch stream that broke mid-way rather than one etcd refused: re-opened.
_STREAM_BROKEN = (rpc.StatusCode.UNKNOWN, rpc.StatusCode.INTERNAL)


async def watch_etcd_prefix(
    connection: EtcdConnection,
    root: str,
    prefix: str,
    *,
    start_revision: int | None,
    current_revision: Callable[[], Awaitable[int]],
) -> AsyncGenerator[WatchEvent, None]:
    """`MetadataStore.watch_prefix` for etcd: keys under `root` + `prefix`, from
    `start_revision` (None: `current_revision()` + 1 when iteration starts)."""
    check_key(prefix)
    full_prefix = (root + prefix).encode()
    range_end = prefix_end(full_prefix.decode()).encode()
    if start_revision is None:
        start_revision = await current_revision() + 1
    next_revision = start_revision
    backoff = Backoff(MIN_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS)
    while not connection.closed:
        create = rpc.WatchCreateRequest(
            key=full_prefix, range_end=range_end, start_revision=next_revision
        )
        outgoing: asyncio.Queue[Any] = asyncio.Queue(maxsize=WATCH_SILENT_PERIODS + 1)
        outgoing.put_nowait(rpc.WatchRequest(create_request=create))
        # The member requests would go to now: not one that failed within the cool-down.
        used = connection.choose_member()
        call = connection.watch.Watch(
            _requests(outgoing), metadata=(*(connection.metadata or ()), _REQUIRE_LEADER)
        )
        connection.watch_calls[call] = used
        heard = _Heard(asyncio.get_running_loop().time())
        keeper = asyncio.get_running_loop().create_task(
            _keep_watch_honest(connection, call, used, outgoing, heard), name=f"etcd-watch {prefix}"
        )
        try:
            async for response in call:
                heard.at = asyncio.get_running_loop().time()
                if response.compact_revision:
                    raise WatchCompactedError(
                        f"watch on {prefix}: etcd compacted revisions up to"
                        f" {response.compact_revision}, after {next_revision - 1}"
                    )
                if response.canceled:
                    raise MetadataError(f"watch on {prefix} canceled: {response.cancel_reason}")
                for event in response.events:
                    heard.consumer_busy = True  # Its time at the consumer is not silence.
                    yield _watch_event(root, event)
                    heard.consumer_busy = False
                    heard.at = asyncio.get_running_loop().time()
                    next_revision = int(event.kv.mod_revision) + 1
                backoff.reset()
        except asyncio.CancelledError:
            if call not in connection.moved_calls or _cancelling():
                raise
            continue  # Moved to another member: re-open there at once.
        except rpc.AioRpcError as error:
            if call in connection.moved_calls:
                continue
            if connection.closed or error.code() == rpc.StatusCode.CANCELLED:
                return
            # UNKNOWN and INTERNAL: the stream broke mid-way (a member killed under it gives
            # gRPC core's "Internal error from Core"); as etcd's own client does, re-open.
            if not connection_lost(error) and error.code() not in _STREAM_BROKEN:
                raise MetadataError(
                    f"watch on {prefix} failed: {error.code().name}: {error.details()}"
                ) from None
            connection.fail_over(used, error.code())
            log.warning(
                "etcd_watch_reconnecting", prefix=prefix, from_revision=next_revision,
                delay_seconds=round(backoff.step(), 3), code=error.code().name,
            )  # fmt: skip
        finally:
            keeper.cancel()
            connection.watch_calls.pop(call, None)
            connection.moved_calls.discard(call)
            # cancel() does nothing to a call that already ended (etcd went away): ending
            # the request stream is what lets gRPC's task that reads it finish.
            with contextlib.suppress(asyncio.QueueFull):
                outgoing.put_nowait(None)
            call.cancel()
        await asyncio.sleep(backoff.next_delay())


async def _keep_watch_honest(
    connection: EtcdConnection, call: Any, used: int, outgoing: asyncio.Queue[Any], heard: _Heard
) -> None:
    """While the watch hears nothing, ask its member for a progress report every
    WATCH_IDLE_SECONDS; a member that answers none of WATCH_SILENT_PERIODS is lost."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            await asyncio.sleep(WATCH_IDLE_SECONDS)
            if heard.consumer_busy:
                continue
            silent = loop.time() - heard.at
            if silent >= WATCH_IDLE_SECONDS * WATCH_SILENT_PERIODS:
                if connection.current == used:
                    connection.fail_over(used, rpc.StatusCode.DEADLINE_EXCEEDED)
                _reopen(connection, call)  # Single member, or moved by another request.
                return
            if silent >= WATCH_IDLE_SECONDS and not outgoing.full():
                outgoing.put_nowait(rpc.WatchRequest(progress_request=rpc.WatchProgressRequest()))
    except Exception as error:
        # A bug here must not pass silently, nor leave the watch without its silence detection
        # (it would stall on a member that stopped sending): reported, and the watch re-opens
        # with a fresh keeper. A keeper fails no sooner than WATCH_IDLE_SECONDS after it starts,
        # so a bug that repeats re-opens the watch at most that often.
        loop_supervisor().report("etcd_watch_keeper", error)
        _reopen(connection, call)


def _reopen(connection: EtcdConnection, call: Any) -> None:
    """Cancel a watch call still open as moved: its watch re-opens at once, from the revision
    after the last event it delivered (a call that already ended needs nothing)."""
    if call in connection.watch_calls:
        connection.moved_calls.add(call)
        call.cancel()


def _watch_event(root: str, event: Any) -> WatchEvent:
    kind = EventKind.DELETE if event.type == rpc.Event.DELETE else EventKind.PUT
    return WatchEvent(
        kind=kind,
        key=event.kv.key.decode()[len(root) :],
        value=b"" if kind is EventKind.DELETE else bytes(event.kv.value),
        revision=int(event.kv.mod_revision),
    )


@dataclass(slots=True)
class _Heard:
    """When a watch last received anything from etcd (loop time), and whether its consumer
    holds an event right now (the stream is not read meanwhile: not the member's silence)."""

    at: float
    consumer_busy: bool = False


def _cancelling() -> bool:
    """True when the current task itself is being cancelled (not just a call it waits on)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _requests(outgoing: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A watch stream's requests: the create, then progress requests as they are queued, until
    None (the watch is over) or the call is cancelled."""
    while (request := await outgoing.get()) is not None:
        yield request
