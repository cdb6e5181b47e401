"""The batching of a writer's sends: one batch of ADD_ENTRIES frames per bookie per burst.

For a ledger whose write set is the whole ensemble (E = Qw), every add goes to every bookie: the
appends of one loop iteration are packed once (`_frames_of`: frames of at most
ADD_ENTRIES_BATCH_BYTES) and each bookie's connection takes the batch in one call
(`BookiePool.add_entries`), deferred with the other ledgers' batches (`BookiePool.defer_send`).
With `add_batch_wait_us` a burst waits a little for the next append; a wait that caught nothing
makes the next bursts go at once, so that a closed loop does not pay it on every send. A bookie
whose connection takes no writes now holds new appends back until it is writable again
(`LedgerHandle._writable_again`).

Part of `LedgerHandle` (a mixin over `HandleState`, see handle_state.py): its methods are the
handle's own, so a send costs no call more than it would in ledger_handle.py.
"""

from __future__ import annotations

from functools import partial

from bkaio.ledger_client.handle_state import HandleState
from bkaio.ledger_client.types import AddFrame
from bkaio.protocol.encoder import ADD_ENTRIES_BATCH_BYTES, FIXARRAY_HEADER_BYTES, FrameEncoder

# After a batching wait that caught nothing, this many bursts go at once (then waiting is
# tried again): a closed loop pays the wait once in this many sends, not every time.
_BATCH_WAIT_BACKOFF_SENDS = 256
# The fields of an ADD_ENTRIES entry, packed once per append for every bookie: `pack_fields`
# done inline (`FrameEncoder.fields_packer`).
_pack_list = FrameEncoder.fields_packer()


def _frames_of(packed: list[bytes]) -> list[AddFrame]:
    """`packed` cut into frames of at most ADD_ENTRIES_BATCH_BYTES (a larger entry alone)."""
    total = sum(map(len, packed))
    if total <= ADD_ENTRIES_BATCH_BYTES:
        return [(0, len(packed), packed, total)]
    frames: list[AddFrame] = []
    start = 0
    size = 0
    for index, entry_bytes in enumerate(map(len, packed)):
        if size and size + entry_bytes > ADD_ENTRIES_BATCH_BYTES:
            frames.append((start, index, packed[start:index], size))
            start = index
            size = 0
        size += entry_bytes
    frames.append((start, len(packed), packed[start:], size))
    return frames


class AddBatching(HandleState):
    """The batched sends of `LedgerHandle`."""

    def _send_unsent(self, *, now: bool = False) -> None:
        """Send this loop iteration's appends: one batch of ADD_ENTRIES frames per bookie.

        Only for a ledger whose write set is the whole ensemble (E = Qw), so every add goes
        to every bookie. The entries are packed once and each bookie's connection takes the
        batch in one call; a bookie down, or one whose connection takes no ADD_ENTRIES now,
        gets the adds one by one through `_send` instead.

        With `add_batch_wait_us`, a burst (two appends or more) waits for the next append
        first (`_wait_for_more`), unless `now` (an ensemble change, close).
        """
        adds = self._unsent
        if not adds:
            return
        if self._batch_timer is not None:
            if not now:
                return  # Waiting: the next append or the timer sends it.
            self._batch_timer.cancel()
            self._batch_timer = None
        elif (
            not (now or self._batch_waited)
            and self._batch_wait_seconds
            and len(adds) > 1
            and self._wait_for_more()
        ):
            return
        self._batch_waited = False
        self._unsent = []
        if self._error is not None:
            return  # `_fail` resolved them already.
        mask = self._write_set_masks[0]  # E = Qw: every write set is every slot.
        if self._down_mask:
            for add in adds:
                self._send(add, mask)
            return
        lac = adds[-1].lac  # The LAC only grows: the last add carries the highest.
        if lac > self._max_piggybacked_lac:
            self._max_piggybacked_lac = lac
        pack = _pack_list
        skip = FIXARRAY_HEADER_BYTES
        frames = _frames_of(
            [
                pack([add.entry_id, add.lac, add.length, add.digest, add.payload])[skip:]
                for add in adds
            ]
        )
        add_entries = self._add_entries
        ledger_id = self.ledger_id
        master_key = self._master_key
        handlers = self._answer_handlers
        for index, bookie_id in enumerate(self._ensemble):
            if not add_entries(
                bookie_id, ledger_id, False, master_key, handlers[index], adds, frames
            ):
                for add in adds:
                    self._send(add, 1 << index)
        when_writable = self._when_writable
        blocked = self._blocked_on
        for bookie_id in self._ensemble:
            if bookie_id not in blocked and when_writable(
                bookie_id, ledger_id, partial(self._writable_again, bookie_id)
            ):
                blocked.add(bookie_id)

    def _wait_for_more(self) -> bool:
        """Let the unsent burst wait for the next append (at most `add_batch_wait_us`), unless
        waiting is paused after a fruitless wait, or the handle is closing. True: it waits.

        Only a burst waits: a lone append (a serial writer, a slow rate) goes at once, and so
        does everything while a wait that caught nothing is recent (a closed loop whose next
        append needs this one's answer would pay the whole wait every time)."""
        if self._batch_wait_backoff > 0:
            self._batch_wait_backoff -= 1
            return False
        if self._closing or self._error is not None:
            return False
        self._batch_timer = self._loop.call_later(self._batch_wait_seconds, self._batch_wait_over)
        return True

    def _end_batch_wait(self) -> None:
        """An append joined the waiting burst: both go once this loop iteration's appends are
        in (the pool's deferred send, with the other ledgers' batches)."""
        timer = self._batch_timer
        assert timer is not None
        timer.cancel()
        self._batch_timer = None
        self._batch_waited = True
        self._defer_send(self._send_unsent)

    def _batch_wait_over(self) -> None:
        """Nothing came while the burst waited: it goes now; the next bursts go at once."""
        self._batch_timer = None
        self._batch_waited = True
        self._batch_wait_backoff = _BATCH_WAIT_BACKOFF_SENDS
        self._defer_send(self._send_unsent)
