"""READ_LAC long polls: who waits for which ledger's LAC to pass which value. No polling.

The add and WRITE_LAC paths call `notify(ledger_id, lac)` after storage accepted them; each waiter
whose `previous_lac` is now exceeded has its future resolved with the new LAC. Fencing and
shutdown call `wake_ledger`/`wake_all`, so pollers answer promptly with whatever LAC is current.
The number of waiters is bounded per shard and per owner (a connection); past either bound `add`
refuses (TOO_MANY_REQUESTS upstream), so one client cannot take every slot of the shard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from bkaio.errors import TooManyRequestsError

_Waiter = tuple[int, asyncio.Future[int], Hashable]  # previous LAC, future, owner.


class LacWaiters:
    def __init__(self, max_waiters: int, max_per_owner: int | None = None) -> None:
        assert max_waiters > 0, max_waiters
        self._max_waiters = max_waiters
        self._max_per_owner = max_waiters if max_per_owner is None else max_per_owner
        assert self._max_per_owner > 0, max_per_owner
        self._by_ledger: dict[int, list[_Waiter]] = {}
        self._by_owner: dict[Hashable, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def waiting(self, owner: Hashable) -> int:
        """How many polls of `owner` wait now."""
        return self._by_owner.get(owner, 0)

    def add(
        self,
        ledger_id: int,
        previous_lac: int,
        future: asyncio.Future[int],
        owner: Hashable = None,
    ) -> None:
        """Resolve `future` with the ledger's LAC once it exceeds `previous_lac`."""
        if self._count >= self._max_waiters:
            raise TooManyRequestsError(
                f"ledger {ledger_id}: {self._count} long polls already wait on this shard "
                f"(server.max_long_poll_waiters={self._max_waiters}); retry later"
            )
        owned = self._by_owner.get(owner, 0)
        if owned >= self._max_per_owner:
            raise TooManyRequestsError(
                f"ledger {ledger_id}: {owned} long polls of this connection already wait "
                f"(server.max_long_poll_waiters_per_connection={self._max_per_owner}); retry "
                "after one is answered"
            )
        self._by_ledger.setdefault(ledger_id, []).append((previous_lac, future, owner))
        self._by_owner[owner] = owned + 1
        self._count += 1

    def _forget(self, owner: Hashable) -> None:
        self._count -= 1
        left = self._by_owner[owner] - 1
        if left:
            self._by_owner[owner] = left
        else:
            del self._by_owner[owner]

    def remove(self, ledger_id: int, future: asyncio.Future[int]) -> None:
        """Forget `future` (its poll timed out or its connection closed); no-op when gone."""
        waiters = self._by_ledger.get(ledger_id)
        if not waiters:
            return
        kept: list[_Waiter] = []
        for waiter in waiters:
            if waiter[1] is future:
                self._forget(waiter[2])
            else:
                kept.append(waiter)
        if kept:
            self._by_ledger[ledger_id] = kept
        else:
            del self._by_ledger[ledger_id]

    def notify(self, ledger_id: int, lac: int) -> None:
        """The ledger's LAC is now `lac`: resolve every waiter it satisfies."""
        waiters = self._by_ledger.get(ledger_id)
        if not waiters:
            return
        kept: list[_Waiter] = []
        for waiter in waiters:
            previous_lac, future, owner = waiter
            if lac > previous_lac or future.done():
                if not future.done():
                    future.set_result(lac)
                self._forget(owner)
            else:
                kept.append(waiter)
        if kept:
            self._by_ledger[ledger_id] = kept
        else:
            del self._by_ledger[ledger_id]

    def wake_ledger(self, ledger_id: int, lac: int) -> None:
        """Answer every poll on the ledger now (it was fenced): they reply with `lac`."""
        for _, future, owner in self._by_ledger.pop(ledger_id, []):
            self._forget(owner)
            if not future.done():
                future.set_result(lac)

    def wake_all(self) -> list[int]:
        """Answer every poll now (shutdown); returns the ledgers that had waiters."""
        ledger_ids = list(self._by_ledger)
        for waiters in self._by_ledger.values():
            for _, future, _owner in waiters:
                if not future.done():
                    future.cancel()
        self._by_ledger.clear()
        self._by_owner.clear()
        self._count = 0
        return ledger_ids
