"""A ledger's master key is a secret a client proves it holds: storage compares the key an add,
a fence or a WRITE_LAC carries with the recorded one in constant time (`hmac.compare_digest`),
never with `==`, which stops at the first differing byte. Any other key is refused."""

from __future__ import annotations

import hmac

import pytest

from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.errors import UnauthorizedError
from tests.fixtures.storage import add_entry, read_entry
from tests.unit.entrylog.conftest import KEY, OpenStorage, make_entry

LEDGER = 11
WRONG_KEYS = {
    "same length": b"x" * len(KEY),
    "last byte differs": KEY[:-1] + bytes([KEY[-1] ^ 1]),
    "shorter": KEY[:-1],
}


class CompareSpy:
    """Records every `hmac.compare_digest` call and answers as the real one does."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[bytes, bytes]] = []
        self._real = hmac.compare_digest
        monkeypatch.setattr(hmac, "compare_digest", self)

    def __call__(self, a: bytes, b: bytes) -> bool:
        self.calls.append((bytes(a), bytes(b)))
        return self._real(a, b)


async def _storage_with_ledger(open_storage: OpenStorage) -> ShardStorage:
    storage = await open_storage()
    await add_entry(storage, make_entry(LEDGER, 0), KEY)  # Records KEY for the ledger.
    return storage


@pytest.mark.parametrize("wrong", WRONG_KEYS.values(), ids=WRONG_KEYS.keys())
async def test_a_wrong_key_is_refused_and_compared_in_constant_time(
    open_storage: OpenStorage, monkeypatch: pytest.MonkeyPatch, wrong: bytes
) -> None:
    storage = await _storage_with_ledger(open_storage)
    spy = CompareSpy(monkeypatch)

    with pytest.raises(UnauthorizedError, match="add with a master key"):
        await add_entry(storage, make_entry(LEDGER, 1), wrong)
    assert spy.calls and all(call == (KEY, wrong) for call in spy.calls)

    spy.calls.clear()
    with pytest.raises(UnauthorizedError, match="fence with a master key"):
        await storage.fence(LEDGER, wrong)
    assert spy.calls == [(KEY, wrong)]

    spy.calls.clear()
    with pytest.raises(UnauthorizedError, match="write_lac with a master key"):
        await storage.write_lac(LEDGER, wrong, 0)
    assert spy.calls == [(KEY, wrong)]

    state = storage.ledger_state(LEDGER)  # Nothing of the refused requests is applied.
    assert state is not None and not state.fenced and state.last_entry_id == 0
    assert state.explicit_lac == -1


async def test_the_right_key_is_accepted_after_one_constant_time_comparison(
    open_storage: OpenStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = await _storage_with_ledger(open_storage)
    spy = CompareSpy(monkeypatch)
    await add_entry(storage, make_entry(LEDGER, 1), bytes(KEY))  # The common path: one check.
    assert spy.calls == [(KEY, KEY)]
    assert await read_entry(storage, LEDGER, 1) == make_entry(LEDGER, 1)
    spy.calls.clear()
    await storage.write_lac(LEDGER, bytes(KEY), 1)
    await storage.fence(LEDGER, bytes(KEY))
    assert spy.calls == [(KEY, KEY), (KEY, KEY)]
    state = storage.ledger_state(LEDGER)
    assert state is not None and state.fenced
