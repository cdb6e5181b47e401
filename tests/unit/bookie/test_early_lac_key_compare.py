"""A WRITE_LAC's (or an add's) LAC wakes long polls before it is journaled only when its key is
the ledger's, compared in constant time (`hmac.compare_digest`): the master key is a secret, and
`==` stops at the first differing byte."""

from __future__ import annotations

import asyncio
import hmac
from typing import Any, cast

import pytest

from bkaio.bookie.lac_waiters import LacWaiters
from bkaio.bookie.read_entries import notify_lac_early
from bkaio.entrylog.api import LedgerStorage
from bkaio.entrylog.types import LedgerState

LEDGER = 5
KEY = b"k" * 20


class FakeStateStorage:
    """A storage that knows one ledger's state."""

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        if ledger_id != LEDGER:
            return None
        return LedgerState(LEDGER, False, KEY, lac=0, explicit_lac=-1, last_entry_id=3)


async def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    storage = cast(LedgerStorage, FakeStateStorage())
    loop = asyncio.get_running_loop()
    waiters = LacWaiters(max_waiters=4)
    poll = loop.create_future()
    waiters.add(LEDGER, 0, poll)
    notify_lac_early(storage, waiters, LEDGER, b"x" * 20, 2)  # Not the ledger's key.
    assert not poll.done()
    notify_lac_early(storage, waiters, LEDGER, KEY, 2)
    assert poll.result() == 2
    assert compared == [(KEY, b"x" * 20), (KEY, KEY)]
