"""READ_LAC long polls: who waits for which ledger's LAC to pass which value. No polling.

The add and WRITE_LAC paths call `notify(ledger_id, lac)` after storage accepted them; each waiter
whose `previous_lac` is now exceeded has its future resolved with the new LAC. Fencing and
shutdown call `wake_ledger`/`wake_all`, so pollers answer promptly with whatever LAC is current.
The number of waiters is bounded; past the bound `add` refuses (TOO_MANY_REQUESTS upstream).
"""

from __future__ import annotations

import asyncio

from bkaio.errors import TooManyRequestsError


class LacWaiters:
    def __init__(self, max_waiters: int) -> None:
        assert max_waiters > 0, max_waiters
        self._max_waiters = max_waiters
        self._by_ledger: dict[int, list[tuple[int, asyncio.Future[int]]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def add(self, ledger_id: int, previous_lac: int, future: asyncio.Future[int]) -> None:
        """Resolve `future` with the ledger's LAC once it exceeds `previous_lac`."""
        if self._count >= self._max_waiters:
            raise TooManyRequestsError(
                f"ledger {ledger_id}: {self._count} long polls already wait on this shard "
                f"(server.max_long_poll_waiters={self._max_waiters}); retry later"
            )
        self._by_ledger.setdefault(ledger_id, []).append((previous_lac, future))
        self._count += 1

    def remove(self, ledger_id: int, future: asyncio.Future[int]) -> None:
        """Forget `future` (its poll timed out or its connection closed); no-op when gone."""
        waiters = self._by_ledger.get(ledger_id)
        if not waiters:
            return
        kept = [(lac, f) for lac, f in waiters if f is not future]
        self._count -= len(waiters) - len(kept)
        if kept:
            self._by_ledger[ledger_id] = kept
        else:
            del self._by_ledger[ledger_id]

    def notify(self, ledger_id: int, lac: int) -> None:
        """The ledger's LAC is now `lac`: resolve every waiter it satisfies."""
        waiters = self._by_ledger.get(ledger_id)
        if not waiters:
            return
        kept: list[tuple[int, asyncio.Future[int]]] = []
        for previous_lac, future in waiters:
            if lac > previous_lac or future.done():
                if not future.done():
                    future.set_result(lac)
                self._count -= 1
            else:
                kept.append((previous_lac, future))
        if kept:
            self._by_ledger[ledger_id] = kept
        else:
            del self._by_ledger[ledger_id]

    def wake_ledger(self, ledger_id: int, lac: int) -> None:
        """Answer every poll on the ledger now (it was fenced): they reply with `lac`."""
        for _, future in self._by_ledger.pop(ledger_id, []):
            self._count -= 1
            if not future.done():
                future.set_result(lac)

    def wake_all(self) -> list[int]:
        """Answer every poll now (shutdown); returns the ledgers that had waiters."""
        ledger_ids = list(self._by_ledger)
        for waiters in self._by_ledger.values():
            for _, future in waiters:
                if not future.done():
                    future.cancel()
        self._by_ledger.clear()
        self._count = 0
        return ledger_ids
