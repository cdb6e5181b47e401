"""Workload drivers that record every operation in a `History`.

- `Writer`: pipelined appends of unique payloads (`<process>-<ledger>-<seq>-<random>`) to one
  ledger handle, `window` in flight, until stopped, a count is reached, or the handle fails.
- `recover`: open a ledger with recovery and record the sealed end it observed.
- `tail`: a tailing reader that records each entry it reads with the LAC that bounded it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from bkaio.errors import BKError, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError
from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.testing.history import History

PASSWORD = b"fault-suite"
_FATAL = (LedgerFencedError, LedgerClosedError, NotEnoughBookiesError)


class Writer:
    def __init__(
        self,
        history: History,
        handle: LedgerHandle,
        process: str,
        *,
        rng: random.Random,
        window: int = 64,
        payload_bytes: int = 64,
    ) -> None:
        self.history = history
        self.handle = handle
        self.process = process
        self.rng = rng
        self.window = window
        self.payload_bytes = payload_bytes
        self.acked = 0
        self.failed: BaseException | None = None
        self._stop = asyncio.Event()
        self._inflight: set[asyncio.Future[int]] = set()
        self._goal = 0
        self._reached = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def _payload(self, seq: int) -> str:
        head = f"{self.process}-{self.handle.ledger_id}-{seq}-"
        size = max(4, self.payload_bytes - len(head))
        tail = "".join(self.rng.choices("abcdefghijklmnop", k=size))
        return head + tail

    def append_one(self, seq: int) -> asyncio.Future[int] | None:
        """Invoke one add; None when the handle refuses at once (recorded as such)."""
        value = self._payload(seq)
        inv = self.history.invoke(self.process, "add", self.handle.ledger_id, value=value)
        try:
            future = self.handle.append(value.encode())
        except Exception as error:
            self.history.failed(inv, error)
            self.failed = error
            return None

        def done(f: asyncio.Future[int]) -> None:
            self._inflight.discard(f)
            if f.cancelled():
                self.history.info(inv, "cancelled")
            elif f.exception() is not None:
                error = f.exception()
                assert error is not None
                self.history.failed(inv, error)
                if isinstance(error, _FATAL) and self.failed is None:
                    self.failed = error
            else:
                self.acked += 1
                self.history.ok(inv, entry=f.result())
            if self.acked >= self._goal or self.failed is not None:
                self._reached.set()

        future.add_done_callback(done)
        self._inflight.add(future)
        return future

    async def wait_acked(self, count: int, seconds: float = 60.0) -> None:
        """Until `count` adds are acknowledged in all (or the writer failed for good)."""
        self._goal = count
        self._reached.clear()
        if self.acked < count and self.failed is None:
            await asyncio.wait_for(self._reached.wait(), seconds)

    async def run(self, count: int | None = None, *, pace: float = 0.0) -> None:
        seq = 0
        while not self._stop.is_set() and self.failed is None and (count is None or seq < count):
            while len(self._inflight) >= self.window and not self._stop.is_set():
                await asyncio.wait(set(self._inflight), return_when=asyncio.FIRST_COMPLETED)
            if self._stop.is_set() or self.failed is not None:
                break
            if self.append_one(seq) is None:
                break
            seq += 1
            await asyncio.sleep(pace)

    async def drain(self, seconds: float) -> None:
        """Wait for what is in flight (whatever the outcome) up to `seconds`."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=seconds)


async def recover(
    history: History, bk: BookKeeper, ledger_id: int, process: str, *, seconds: float = 30.0
) -> int | None:
    """open_ledger(recovery=True); records a `seal` op. The sealed last entry id, or None."""
    inv = history.invoke(process, "seal", ledger_id)
    try:
        handle = await asyncio.wait_for(
            bk.open_ledger(ledger_id, password=PASSWORD, recovery=True), seconds
        )
    except Exception as error:
        history.failed(inv, error)
        return None
    last = int(handle.last_entry_id)
    history.ok(inv, value=last)
    with contextlib.suppress(Exception):
        await handle.close()
    return last


async def close_writer(history: History, handle: LedgerHandle, process: str) -> int | None:
    """The writer's own close, recorded as `close` (ok value: its sealed last entry)."""
    inv = history.invoke(process, "close", handle.ledger_id)
    try:
        await asyncio.wait_for(handle.close(), 30)
    except Exception as error:
        history.failed(inv, error)
        return None
    last = int(handle.metadata.last_entry_id)
    history.ok(inv, value=last)
    return last


async def tail(
    history: History,
    bk: BookKeeper,
    ledger_id: int,
    process: str,
    stop: asyncio.Event,
) -> int:
    """Read entries 0, 1, ... as the LAC allows, until `stop`; the count read."""
    handle = await bk.open_ledger(ledger_id, password=PASSWORD, recovery=False)
    next_id = 0
    try:
        while not stop.is_set():
            try:
                entry = await handle.wait_for_entry(next_id, timeout=0.5)
            except BKError:
                await asyncio.sleep(0.1)
                continue
            if entry is None:
                continue
            inv = history.invoke(
                process, "read", ledger_id, entry=next_id, extra={"lac": handle.last_add_confirmed}
            )
            history.ok(inv, value=entry.payload.decode())
            next_id += 1
    finally:
        with contextlib.suppress(Exception):
            await handle.close()
    return next_id
