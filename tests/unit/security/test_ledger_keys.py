"""First-sight master keys checked against ledger metadata (with a FakeKeySource)."""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import MetadataError, UnauthorizedError
from bkaio.protocol.digest import master_key, password_check
from bkaio.security.ledger_keys import LedgerKeyRefusedError, LedgerKeyVerifier


class FakeKeySource:
    """Password hashes by ledger id; counts reads; can fail or stall on demand."""

    def __init__(self, hashes: dict[int, bytes]) -> None:
        self.hashes = hashes
        self.reads = 0
        self.fail = False
        self.gate: asyncio.Event | None = None
        self.closed = False

    async def password_hash(self, ledger_id: int) -> bytes | None:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise MetadataError("metadata store unreachable")
        return self.hashes.get(ledger_id)

    async def close(self) -> None:
        self.closed = True


def _verifier(source: FakeKeySource, cache_entries: int = 100) -> LedgerKeyVerifier:
    async def open_source() -> FakeKeySource:
        return source

    return LedgerKeyVerifier(open_source, cache_entries=cache_entries)


def _hash(password: bytes, ledger_id: int) -> bytes:
    return password_check(master_key(password, ledger_id))


async def test_the_right_key_is_accepted_and_cached() -> None:
    source = FakeKeySource({5: _hash(b"pw", 5)})
    verifier = _verifier(source)
    for _ in range(3):
        await verifier.verify(5, master_key(b"pw", 5))
    assert source.reads == 1
    assert verifier.stats.accepted == 3 and verifier.stats.cache_hits == 2
    await verifier.close()
    assert source.closed


async def test_a_wrong_key_is_refused_even_when_cached() -> None:
    source = FakeKeySource({5: _hash(b"pw", 5)})
    verifier = _verifier(source)
    await verifier.verify(5, master_key(b"pw", 5))
    for key in (master_key(b"guess", 5), master_key(b"pw", 6), b"\0" * 32, b""):
        with pytest.raises(LedgerKeyRefusedError, match="does not match") as refused:
            await verifier.verify(5, key)
        assert refused.value.reason == "wrong_key"
        assert isinstance(refused.value, UnauthorizedError)
    assert verifier.stats.refused_wrong_key == 4


async def test_a_ledger_without_metadata_is_refused_and_not_cached() -> None:
    source = FakeKeySource({})
    verifier = _verifier(source)
    with pytest.raises(LedgerKeyRefusedError, match="no metadata") as refused:
        await verifier.verify(9, master_key(b"pw", 9))
    assert refused.value.reason == "no_metadata"
    source.hashes[9] = _hash(b"pw", 9)  # Created meanwhile: the next request passes.
    await verifier.verify(9, master_key(b"pw", 9))
    assert source.reads == 2


async def test_metadata_without_a_hash_accepts_any_key() -> None:
    verifier = _verifier(FakeKeySource({3: b""}))
    await verifier.verify(3, b"anything")


async def test_concurrent_first_requests_share_one_read() -> None:
    source = FakeKeySource({5: _hash(b"pw", 5)})
    source.gate = asyncio.Event()
    verifier = _verifier(source)
    key = master_key(b"pw", 5)
    checks = [asyncio.create_task(verifier.verify(5, key)) for _ in range(50)]
    await asyncio.sleep(0.01)
    source.gate.set()
    await asyncio.gather(*checks)
    assert source.reads == 1


async def test_a_failed_read_fails_every_waiter_and_the_next_request_retries() -> None:
    source = FakeKeySource({5: _hash(b"pw", 5)})
    source.gate = asyncio.Event()
    source.fail = True
    verifier = _verifier(source)
    key = master_key(b"pw", 5)
    checks = [asyncio.create_task(verifier.verify(5, key)) for _ in range(3)]
    await asyncio.sleep(0.01)
    source.gate.set()
    results = await asyncio.gather(*checks, return_exceptions=True)
    assert all(isinstance(result, MetadataError) for result in results)
    source.fail = False
    await verifier.verify(5, key)


async def test_the_cache_is_bounded() -> None:
    source = FakeKeySource({i: _hash(b"pw", i) for i in range(20)})
    verifier = _verifier(source, cache_entries=5)
    for i in range(20):
        await verifier.verify(i, master_key(b"pw", i))
    await verifier.verify(19, master_key(b"pw", 19))  # Recent: cached.
    assert source.reads == 20
    await verifier.verify(0, master_key(b"pw", 0))  # Evicted: read again.
    assert source.reads == 21
