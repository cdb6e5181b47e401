"""Back pressure on a journal's appenders: waiting for room in the filling group.

The group being filled is bounded by `max_group_bytes` and `max_group_entries`. An appender
that finds it full awaits `wait_for_room()` and then appends with no await in between.
Waiters are served in arrival order. A hand-off of the filling group to the writer wakes as
many of the oldest as the new group can take, by the size of the records of the group just
handed off (`_wake_room_waiters`); the last of them wakes the next batch if room is left.
Waking them all cost a check and a new future per waiter per hand-off: under load, thousands
waiting, that was most of the loop's time.

`GroupRoom` is a mixin of `Journal` (journal.py): the journal's state, this module's methods,
so that the add path calls them as it always did, with no layer in between.
"""

from __future__ import annotations

import asyncio
from collections import deque

from bkaio.journal.config import JournalConfig


class GroupRoom:
    """The room-waiting part of `Journal` (a mixin; its attributes are set by `Journal`)."""

    _loop: asyncio.AbstractEventLoop
    _config: JournalConfig
    _data: bytearray  # The filling group's records.
    _ends: list[int]  # The offset after each of them.
    # Appenders waiting for a group with room, oldest first.
    _room_waiters: deque[asyncio.Future[None]]
    _room_wakes: int  # Waiters of the last wake that have not run yet.
    _requeued: int  # Of those, how many found no room and queued again at the head.
    _batch_broken: bool  # One of them did: the rest of that wake queues again too.
    _record_bytes_estimate: int  # Bytes per record of the last group handed off.

    def _check_usable(self, *, closing_ok: bool = False) -> None:
        raise NotImplementedError  # Defined by `Journal`: raises once it failed or closes.

    def _has_room(self) -> bool:
        return (
            len(self._data) < self._config.max_group_bytes
            and len(self._ends) < self._config.max_group_entries
        )

    async def wait_for_room(self) -> None:
        """Return once the next group can take a record (at once, unless it is full); the
        caller appends without awaiting in between. Waiters are served in arrival order."""
        waiters = self._room_waiters
        if not waiters and self._room_wakes <= 0 and self._has_room():
            self._check_usable()
            return
        self._check_usable()
        room: asyncio.Future[None] = self._loop.create_future()
        waiters.append(room)  # Behind woken waiters that have not run yet, too.
        try:
            await room
            self._room_wakes -= 1
            while self._batch_broken or not self._has_room():
                self._check_usable()
                # An earlier waiter of this wake found no room and queued again: so does every
                # later one, or it would append ahead of that waiter. First again at the next
                # wake, in the order they were woken in.
                self._batch_broken = True
                room = self._loop.create_future()
                waiters.insert(self._requeued, room)
                self._requeued += 1
                if self._room_wakes <= 0 and self._has_room():
                    self._wake_room_waiters()  # The last of a broken wake: start it again.
                await room
                self._room_wakes -= 1
        except BaseException:
            if room in waiters:
                if waiters.index(room) < self._requeued:
                    self._requeued -= 1
                waiters.remove(room)
            elif room.done() and not room.cancelled():
                self._room_wakes -= 1  # Woken, but gone.
            if self._room_wakes <= 0 and waiters:
                self._wake_room_waiters()  # Its turn passes on.
            raise
        self._check_usable()
        if self._room_wakes <= 0 and waiters:
            # The last of its batch: the next batch runs after this caller's append (later
            # loop callbacks), and checks the room then.
            self._wake_room_waiters()

    def _wake_room_waiters(self) -> None:
        """Wake as many of the oldest waiters as the filling group has room for, by the size
        of the records of the last group: they append in one loop iteration, into one group.

        Not while waiters of the previous wake have yet to run: those are older than any
        still queued, and the last of them wakes the next batch.
        """
        if self._room_wakes > 0:
            return
        waiters = self._room_waiters
        config = self._config
        records = min(
            config.max_group_entries - len(self._ends),
            (config.max_group_bytes - len(self._data)) // self._record_bytes_estimate + 1,
        )
        woken = 0
        self._requeued = 0
        self._batch_broken = False
        while waiters and woken < records:
            room = waiters.popleft()
            if not room.done():
                room.set_result(None)
                woken += 1
        self._room_wakes = woken

    def _wake_all_room_waiters(self) -> None:
        """The journal failed: every waiter returns, and `wait_for_room` raises the failure."""
        for room in self._room_waiters:
            if not room.done():
                room.set_result(None)  # wait_for_room re-checks and raises the failure.
        self._room_waiters.clear()
        self._room_wakes = self._requeued = 0
