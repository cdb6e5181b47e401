"""A writer that cannot reach its bookies fails with a reason instead of swapping bookies forever.

Real bookie processes on loopback: TLS bookies and a plain-TCP client (the `bkaio standalone
--tls` mistake), plain bookies and a TLS client, and a cluster whose every bookie is killed.
Each ends in NotEnoughBookiesError whose message says why (and which setting to change),
after at most one ledger metadata write per registered bookie, and nothing grows afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.errors import BookieUnavailableError, NotEnoughBookiesError
from bkaio.ledger_client import BookKeeper, LedgerHandle
from bkaio.meta.ledgers import ledger_key
from bkaio.security.local_ca import generate_local_tls
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory, running_on_own_loop

# Hang guard only: every case below fails within a few seconds on a quiet box.
_GUARD_SECONDS = 60.0


async def _metadata_writes(bk: BookKeeper, ledger_id: int, since_version: int) -> int:
    """How many times the ledger's metadata record was written after `since_version`, counted
    from the store's change history (not from the version numbers, which are store-wide)."""
    assert bk.metadata is not None
    final = (await bk.get_ledger_metadata(ledger_id)).version
    if final == since_version:
        return 0
    key = ledger_key(ledger_id)
    writes = 0
    events = bk.metadata.store.watch_prefix(key, start_revision=since_version + 1)
    async with asyncio.timeout(_GUARD_SECONDS), contextlib.aclosing(events):
        async for event in events:
            if event.key == key:
                writes += 1
            if event.revision >= final:
                return writes
    raise AssertionError("the watch ended early")


async def _append_fails(lh: LedgerHandle) -> NotEnoughBookiesError:
    with pytest.raises(NotEnoughBookiesError) as caught:
        await asyncio.wait_for(lh.append(b"never acknowledged"), _GUARD_SECONDS)
    with pytest.raises(NotEnoughBookiesError):
        lh.append(b"a later append fails at once")
    return caught.value


async def _assert_bounded(bk: BookKeeper, lh: LedgerHandle, created: int, bookies: int) -> None:
    writes = await _metadata_writes(bk, lh.ledger_id, created)
    assert writes <= bookies, f"{writes} metadata writes for {bookies} bookies"
    await asyncio.sleep(1.0)  # Nothing keeps rewriting the record after the failure.
    assert await _metadata_writes(bk, lh.ledger_id, created) == writes
    assert len(lh.metadata.ensembles) <= bookies


@pytest.fixture(scope="module")
def tls_bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    """Three bookies serving TLS with client certificates required, started once for the
    quorum cases: a client that fails to connect changes nothing on a bookie, and each case
    writes (and counts the writes of) its own ledger. On a loop of its own: the tests' loops
    are per test."""
    base = tmp_path_factory.mktemp("tls-bookies")
    local = generate_local_tls(base / "tls")
    cluster = BookieCluster(
        f"sqlite://{base / 'meta.db'}",
        base,
        count=3,
        config={"tls": local.bookie_tls_section(require_client_cert=True)},
    )
    with running_on_own_loop(cluster):
        yield cluster


@pytest.mark.parametrize("quorums", [(1, 1, 1), (2, 2, 1), (2, 1, 1), (2, 2, 2)])
async def test_a_plain_client_of_tls_bookies_fails_saying_it_needs_tls(
    tls_bookies: BookieCluster, quorums: tuple[int, int, int]
) -> None:
    async with BookKeeper.connect(tls_bookies.metadata_uri) as bk:  # No tls=: the mistake.
        lh = await bk.create_ledger(*quorums, password=b"pw")
        created = lh.metadata.version
        error = await _append_fails(lh)
        message = str(error)
        assert "serves TLS and this client connects in plain TCP" in message
        assert "BKAIO_TLS_CA" in message and "tls=" in message
        assert isinstance(error.__cause__, BookieUnavailableError)
        await _assert_bounded(bk, lh, created, bookies=3)


async def test_a_tls_client_of_plain_bookies_fails_saying_they_do_not_speak_tls(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    local = await asyncio.to_thread(generate_local_tls, tmp_path / "tls")
    cluster = await bookie_cluster_factory(count=2)
    async with BookKeeper.connect(cluster.metadata_uri, tls=local.client_context()) as bk:
        lh = await bk.create_ledger(1, 1, 1, password=b"pw")
        created = lh.metadata.version
        error = await _append_fails(lh)
        assert "does not speak TLS" in str(error) and "BKAIO_TLS_CA" in str(error)
        await _assert_bounded(bk, lh, created, bookies=2)


async def test_a_client_of_mutual_tls_bookies_without_a_certificate_is_told_so(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    local = await asyncio.to_thread(generate_local_tls, tmp_path / "tls")
    cluster = await bookie_cluster_factory(
        count=2, config={"tls": local.bookie_tls_section(require_client_cert=True)}
    )
    no_certificate: ssl.SSLContext = local.client_context(with_client_cert=False)
    async with BookKeeper.connect(cluster.metadata_uri, tls=no_certificate) as bk:
        lh = await bk.create_ledger(2, 2, 2, password=b"pw")
        created = lh.metadata.version
        error = await _append_fails(lh)
        assert "client certificate" in str(error) and "BKAIO_TLS_CERT" in str(error)
        await _assert_bounded(bk, lh, created, bookies=2)


async def test_a_writer_whose_every_bookie_died_fails_its_pending_and_later_appends(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=4)
    async with BookKeeper.connect(cluster.metadata_uri, add_timeout=2.0) as bk:
        lh = await bk.create_ledger(2, 2, 2, password=b"pw")
        assert await asyncio.gather(*(lh.append(b"%d" % i) for i in range(50))) == list(range(50))
        before = (await bk.get_ledger_metadata(lh.ledger_id)).version
        for index in range(4):
            cluster.kill9(index)
        pending = [lh.append(b"after the crash %d" % i) for i in range(20)]
        results = await asyncio.wait_for(
            asyncio.gather(*pending, return_exceptions=True), _GUARD_SECONDS
        )
        assert all(isinstance(r, NotEnoughBookiesError) for r in results), results
        error = results[0]
        assert isinstance(error, NotEnoughBookiesError)
        assert isinstance(error.__cause__, BookieUnavailableError)
        assert "cannot connect" in str(error) or "lost connection" in str(error)
        with pytest.raises(NotEnoughBookiesError):
            lh.append(b"later")
        assert lh.last_add_confirmed == 49
        await _assert_bounded(bk, lh, before, bookies=4)
        await lh.close()  # Seals what was acknowledged.
        md = await bk.get_ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == 49


async def test_a_client_that_does_not_trust_the_bookies_certificate_is_told_so(
    bookie_cluster_factory: BookieClusterFactory, tmp_path: Path
) -> None:
    local = await asyncio.to_thread(generate_local_tls, tmp_path / "tls")
    other = await asyncio.to_thread(generate_local_tls, tmp_path / "another-ca")
    cluster = await bookie_cluster_factory(count=1, config={"tls": local.bookie_tls_section()})
    async with BookKeeper.connect(cluster.metadata_uri, tls=other.client_context()) as bk:
        lh = await bk.create_ledger(1, 1, 1, password=b"pw")
        created = lh.metadata.version
        error = await _append_fails(lh)
        assert "certificate is not trusted" in str(error) and "BKAIO_TLS_CA" in str(error)
        await _assert_bounded(bk, lh, created, bookies=1)
