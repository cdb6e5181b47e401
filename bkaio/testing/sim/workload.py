"""What the simulated applications do, every operation recorded in the cluster's history.

- `writer`: creates a ledger and appends unique payloads with a window of adds in flight, until
  its count, the handle's failure (fenced, no bookies) or its process's death; optionally closes.
- `tail_reader`: follows a ledger as it is written (long polls for the LAC, reads each entry up
  to it, `extra.lac` on every read), until the ledger is closed or the reader is told to stop.
- `recoverer`: opens the ledger with recovery (fence, recover, seal): a `seal` observation.

Each runs as a task of a `SimClient` process: when the process crashes, the task simply stops,
and whatever it had invoked stays open in the history (indeterminate, as the checker treats it).
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bkaio.errors import BKError, NoSuchEntryError
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.testing.history import Invocation
from bkaio.testing.sim.cluster import PASSWORD, SimCluster
from bkaio.testing.sim.nodes import SimClient


@dataclass
class WriterPlan:
    count: int
    window: int
    pace: float  # Up to this long between two appends.
    close: bool = False  # Close the ledger after the last add.
    # Called with the number of adds acknowledged so far, at each acknowledgement (a nemesis
    # that strikes right after one: the moment a durability bug shows).
    on_ack: Callable[[int], object] | None = field(default=None, repr=False)


async def writer(
    cluster: SimCluster,
    client: SimClient,
    plan: WriterPlan,
    created: asyncio.Future[int],
    rng: random.Random,
) -> None:
    history = cluster.history
    name = client.name
    try:
        bk = await client.connect()
        handle = await bk.create_ledger(*cluster.options.quorum, password=PASSWORD)
    except BKError as error:
        if not created.done():
            created.set_exception(error)
        return
    ledger_id = handle.ledger_id
    cluster.ledgers.append(ledger_id)
    created.set_result(ledger_id)
    inflight: deque[asyncio.Future[int]] = deque()

    acked = 0

    def completed(inv: Invocation, future: asyncio.Future[int]) -> None:
        nonlocal acked
        if future.cancelled():
            history.info(inv, "cancelled")
        elif (error := future.exception()) is not None:
            history.failed(inv, error)
        else:
            history.ok(inv, entry=future.result())
            acked += 1
            if plan.on_ack is not None:
                plan.on_ack(acked)

    for seq in range(plan.count):
        while inflight and (len(inflight) >= plan.window or inflight[0].done()):
            oldest = inflight.popleft()
            if not oldest.done():
                await asyncio.wait((oldest,))
        value = f"{name}-{ledger_id}-{seq}"
        inv = history.invoke(name, "add", ledger_id, value=value)
        try:
            future = handle.append(value.encode())
        except BKError as error:
            history.failed(inv, error)
            break
        future.add_done_callback(functools.partial(completed, inv))
        inflight.append(future)
        if plan.pace:
            await asyncio.sleep(rng.uniform(0.0, plan.pace))
    if inflight:
        await asyncio.wait(inflight)
    if plan.close:
        await close(cluster, client, handle)


async def close(cluster: SimCluster, client: SimClient, handle: LedgerHandle) -> None:
    inv = cluster.history.invoke(client.name, "close", handle.ledger_id)
    try:
        await handle.close()
    except BKError as error:
        cluster.history.failed(inv, error)
        return
    cluster.history.ok(inv, value=handle.last_add_confirmed)


async def _created(ledger: asyncio.Future[int]) -> int | None:
    """The writer's ledger, or None when it could not create one."""
    try:
        return await asyncio.shield(ledger)
    except BKError:
        return None


async def recoverer(
    cluster: SimCluster, client: SimClient, ledger: asyncio.Future[int]
) -> int | None:
    ledger_id = await _created(ledger)
    if ledger_id is None:
        return None
    inv = cluster.history.invoke(client.name, "seal", ledger_id)
    try:
        bk = await client.connect()
        handle = await bk.open_ledger(ledger_id, PASSWORD, recovery=True)
    except BKError as error:
        cluster.history.failed(inv, error)
        return None
    cluster.history.ok(inv, value=handle.last_entry_id)
    return handle.last_entry_id


async def tail_reader(
    cluster: SimCluster, client: SimClient, ledger: asyncio.Future[int], until: float
) -> None:
    """Read every entry as it becomes confirmed, until the ledger closes or `until` (virtual)."""
    history = cluster.history
    ledger_id = await _created(ledger)
    if ledger_id is None:
        return
    loop = asyncio.get_running_loop()
    bk = await client.connect()
    handle = None
    while handle is None:
        try:
            handle = await bk.open_ledger(ledger_id, PASSWORD, recovery=False)
        except BKError:
            if loop.time() >= until:
                return
            await asyncio.sleep(0.05)
    next_entry = 0
    while loop.time() < until:
        inv = history.invoke(client.name, "read", ledger_id, entry=next_entry)
        try:
            entry = await handle.wait_for_entry(next_entry, timeout=0.2)
        except NoSuchEntryError as error:
            if not handle.is_closed or next_entry <= handle.last_entry_id:
                history.failed(inv, error)  # A bookie's negative: the checker judges it.
                await asyncio.sleep(0.02)
                continue
            # Closed before it: what the metadata says is the end, a seal observation.
            history.info(inv, "closed-before")
            seal = history.invoke(client.name, "seal", ledger_id)
            history.ok(seal, value=handle.last_entry_id)
            return
        except BKError as error:
            history.failed(inv, error)
            await asyncio.sleep(0.02)
            continue
        if entry is None:
            history.info(inv, "not-yet")
            continue
        history.ok(inv, value=entry.payload.decode(), extra={"lac": handle.last_add_confirmed})
        next_entry += 1
