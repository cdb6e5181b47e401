"""Stream and namespace record writes whose answer the metadata store lost.

The answer is lost below StreamStore, in the SQLite store (as an etcd connection breaking
with the write in flight): the write applied ("applied"), or held and applied just before its
next copy arrives ("late": an etcd member cut off forwarding a buffered request when it comes
back). Each caller must go on as if it had had the answer.
"""

from __future__ import annotations

import contextlib

import pytest

from bkaio.errors import MetadataVersionError
from bkaio.meta import Lease
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.records import NamespaceStore
from bkaio.meta.sqlite_driver import SqliteMetadataStore
from bkaio.stream import open_namespace
from bkaio.stream.store import StreamStore, metadata_of
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take

STREAM_KEY = StreamStore.stream_key("tenant", "s")


class LoseNext:
    """Patches SqliteMetadataStore.compare_and_swap: the next CAS of `key` loses its answer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, key: str, mode: str) -> None:
        self.key: str | None = None
        self.target, self.mode = key, mode
        self.held: list[tuple[SqliteMetadataStore, bytes, int]] = []
        self.lost = 0
        real_cas = SqliteMetadataStore.compare_and_swap

        async def cas(
            store: SqliteMetadataStore,
            key: str,
            value: bytes,
            *,
            expected_version: int,
            lease: Lease | None = None,
        ) -> int:
            for held in [h for h in self.held if key == self.target]:  # The late copy first.
                self.held.remove(held)
                with contextlib.suppress(MetadataVersionError):  # Stale: it cannot land.
                    await real_cas(held[0], key, held[1], expected_version=held[2])
            if key != self.key:
                return await real_cas(
                    store, key, value, expected_version=expected_version, lease=lease
                )
            self.key = None
            self.lost += 1
            if self.mode == "applied":
                await real_cas(store, key, value, expected_version=expected_version)
            else:
                self.held.append((store, value, expected_version))
            raise MetadataOutcomeUnknownError(f"lost the answer for {key}")

        monkeypatch.setattr(SqliteMetadataStore, "compare_and_swap", cas)

    def arm(self) -> None:
        self.key = self.target


async def test_a_roll_whose_first_copy_lands_late_is_not_fenced(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copy sent again was refused because the first landed meanwhile: the writer took its
    # own roll for another writer's and failed (LedgerFencedError, "fenced by epoch 1").
    ns = await open_namespace(await make_client(), "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=10)
    loser = LoseNext(monkeypatch, STREAM_KEY, "late")
    loser.arm()
    first = await writer.write(b"0123456789")  # Fills the segment: a roll.
    await writer.wait_for_capacity()
    second = await writer.write(b"after the roll")
    await writer.close()
    assert loser.lost == 1 and not loser.held
    async with await ns.open_reader("s") as reader:
        records = await take(reader, 2)
    assert [(r.position, r.payload) for r in records] == [
        (first, b"0123456789"),
        (second, b"after the roll"),
    ]


async def test_opening_a_writer_whose_first_copy_lands_late(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The open deleted its new ledger, then the late copy landed naming it: the stream's
    # record named a deleted ledger (the open failed with NoSuchLedgerError).
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    loser = LoseNext(monkeypatch, STREAM_KEY, "late")
    loser.arm()
    writer = await ns.open_writer("s")
    position = await writer.write(b"one")
    await writer.close()
    assert loser.lost == 1 and not loser.held
    meta = await ns.stream_metadata("s")
    for segment in meta.segments:
        await bk.get_ledger_metadata(segment.ledger_id)  # Every named ledger exists.
    async with await ns.open_reader("s") as reader:
        [record] = await take(reader, 1)
    assert (record.position, record.payload) == (position, b"one")


async def test_updating_settings_whose_answer_was_lost(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MetadataOutcomeUnknownError reached the caller though the settings were written.
    ns = await open_namespace(await make_client(), "tenant", create=True)
    loser = LoseNext(monkeypatch, NamespaceStore.namespace_key("tenant"), "applied")
    loser.arm()
    settings = await ns.update_settings(quota_bytes=1000)
    assert loser.lost == 1
    assert settings.quota_bytes == 1000 and (await ns.refresh()) == settings


async def test_creating_a_stream_whose_answer_was_lost(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MetadataOutcomeUnknownError reached the caller though the stream was created.
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    loser = LoseNext(monkeypatch, STREAM_KEY, "applied")
    loser.arm()
    meta = await ns.create_stream("s")
    assert loser.lost == 1
    assert meta == await ns.stream_metadata("s")
    assert await metadata_of(bk).store.get(STREAM_KEY) is not None
