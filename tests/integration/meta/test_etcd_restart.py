"""etcd goes away under a live client: operations retry, watches resume, nothing is lost."""

from __future__ import annotations

import asyncio
import contextlib

from bkaio.meta import open_store
from bkaio.meta.store import WatchEvent
from tests.fixtures.etcd import EtcdServer
from tests.integration.meta.helpers import eventually


async def test_watch_and_operations_survive_an_etcd_restart(etcd_server: EtcdServer) -> None:
    store = await open_store(etcd_server.uri)
    received: list[WatchEvent] = []

    async def watch(start_revision: int) -> None:
        async for event in store.watch_prefix("/restart/", start_revision=start_revision):
            received.append(event)

    task = asyncio.create_task(watch(await store.current_revision() + 1))
    try:
        for i in range(5):
            await store.put(f"/restart/{i}", str(i).encode())

        await asyncio.to_thread(etcd_server.kill)
        # Issued while etcd is down: retried until it is back.
        pending_put = asyncio.create_task(store.put("/restart/5", b"5"))
        # By now the channel knows etcd is gone (a write racing the kill itself may have been
        # in flight: MetadataOutcomeUnknownError). A CAS that never left is retried.
        await asyncio.sleep(0.3)
        pending_cas = asyncio.create_task(
            store.compare_and_swap("/restart-cas", b"x", expected_version=0)
        )
        await asyncio.sleep(0.3)
        assert not pending_put.done() and not pending_cas.done()
        await asyncio.to_thread(etcd_server.start)
        await pending_put
        assert await pending_cas > 0
        for i in range(6, 10):
            await store.put(f"/restart/{i}", str(i).encode())

        assert await eventually(lambda: len(received) >= 10, timeout_seconds=20)
        assert [event.value for event in received] == [str(i).encode() for i in range(10)]
        kv = await store.get("/restart/5")
        assert kv is not None and kv.value == b"5"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def test_a_watch_that_lost_etcd_leaves_no_task_behind(etcd_server: EtcdServer) -> None:
    """Each reconnect of a watch ends the old stream's request task (gRPC's reader of it):
    a watch that outlived etcd for a while used to leave one pending task per lost stream."""
    store = await open_store(etcd_server.uri)

    async def watch() -> None:
        async for _event in store.watch_prefix("/gone/"):
            pass

    task = asyncio.create_task(watch())
    try:
        await store.put("/gone/1", b"1")
        await asyncio.sleep(0.3)  # The watch stream is open.
        await asyncio.to_thread(etcd_server.kill)
        await asyncio.sleep(2.0)  # Several reconnect attempts.
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()
    await asyncio.sleep(0.1)
    left = [t for t in asyncio.all_tasks() if "consume_request_iterator" in repr(t)]
    assert left == []


async def test_two_clients_agree_after_a_graceful_restart(etcd_server: EtcdServer) -> None:
    writer = await open_store(etcd_server.uri)
    reader = await open_store(etcd_server.uri)
    try:
        version = await writer.compare_and_swap("/graceful", b"a", expected_version=0)
        await asyncio.to_thread(etcd_server.stop)
        await asyncio.to_thread(etcd_server.start)
        # The data dir survives: the version read after the restart is the one written before.
        kv = await reader.get("/graceful")
        assert kv is not None and kv.version == version
        await writer.compare_and_swap("/graceful", b"b", expected_version=version)
    finally:
        await writer.close()
        await reader.close()
