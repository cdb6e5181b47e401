"""A real bookie process with a ledger in limbo, over the raw protocol: DATA_UNKNOWN for what
it lacks (never NO_SUCH_ENTRY / NO_SUCH_LEDGER), plain adds fenced, recovery adds taken; other
ledgers unchanged; an unreadable LIMBO file refuses the start (exit 2, one line)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from bkaio.bookie.limbo import LimboRecord, enter_limbo, limbo_path
from bkaio.config import load_bookie_config
from bkaio.meta import LedgerMetadata
from bkaio.protocol.messages import (
    Flag,
    ReadEntriesRequest,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadRangeRequest,
    Response,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster, BookieClusterFactory
from tests.fixtures.standalone import bkaio

from .raw_client import FIRST_SIGHT, RawClient, add_request

# No autorecovery; the limbo repair cannot finish (the ledger's other bookie never existed).
CONFIG = {**FIRST_SIGHT, "autorecovery": {"enabled": False}}


async def test_a_ledger_in_limbo_answers_data_unknown_and_is_fenced(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=1, config=CONFIG)
    meta = await cluster.metadata()
    me = cluster.bookie_ids[0]
    md = await meta.ledgers.create(
        LedgerMetadata(
            ensemble_size=2, write_quorum=2, ack_quorum=2, ensembles=((0, (me, "127.0.0.1:1")),)
        )
    )
    await meta.ledgers.update(md.closed(9, 90))
    limbo_ledger, other_ledger = md.ledger_id, md.ledger_id + 1000
    await cluster.stop(0)
    enter_limbo(load_bookie_config(cluster[0].config_path), [limbo_ledger], "test")
    await cluster.start(0)
    client = await RawClient.connect("127.0.0.1", cluster[0].port)

    async def ask(request: object) -> Response:
        return await client.request(request)  # type: ignore[arg-type]

    def read(ledger_id: int, entry_id: int) -> ReadEntryRequest:
        return ReadEntryRequest(client.next_id(), ledger_id, entry_id, Flag.NONE, None)

    def read_range(ledger_id: int, first: int) -> ReadRangeRequest:
        return ReadRangeRequest(client.next_id(), ledger_id, first, 10, 1 << 20, Flag.NONE, None)

    def read_entries(ledger_id: int) -> ReadEntriesRequest:
        return ReadEntriesRequest(
            client.next_id(), ledger_id, 0, 9, 1, 10, 1 << 20, Flag.NONE, -1, 0
        )

    try:
        plain = await ask(add_request(client.next_id(), limbo_ledger, 0, b"zero"))
        assert plain.status is Status.FENCED
        assert (await ask(read(limbo_ledger, 0))).status is Status.DATA_UNKNOWN
        assert (await ask(read_range(limbo_ledger, 0))).status is Status.DATA_UNKNOWN
        recovery = add_request(client.next_id(), limbo_ledger, 0, b"zero", flags=Flag.RECOVERY_ADD)
        assert (await ask(recovery)).status is Status.OK
        assert (await ask(read(limbo_ledger, 0))).status is Status.OK
        assert (await ask(read(limbo_ledger, 1))).status is Status.DATA_UNKNOWN
        assert (await ask(read_range(limbo_ledger, 0))).status is Status.OK  # Entry 0 only.
        assert (await ask(read_range(limbo_ledger, 1))).status is Status.DATA_UNKNOWN
        # A range answer would hold entry 0 alone, saying 1..9 are not stored: refused whole.
        assert (await ask(read_entries(limbo_ledger))).status is Status.DATA_UNKNOWN
        again = await ask(add_request(client.next_id(), limbo_ledger, 1, b"one"))
        assert again.status is Status.FENCED  # Still fenced: it is not out of limbo.

        # Ledgers not in limbo answer as ever.
        added = await ask(add_request(client.next_id(), other_ledger, 0, b"x"))
        assert added.status is Status.OK
        assert (await ask(read(other_ledger, 5))).status is Status.NO_SUCH_ENTRY
        assert (await ask(read(other_ledger + 1, 0))).status is Status.NO_SUCH_LEDGER
        assert (await ask(read_entries(other_ledger))).status is Status.OK
    finally:
        await client.close()


def _start_fails(cluster: BookieCluster) -> str:
    """Start bookie 0, expect it to refuse (exit 2); what it wrote to stderr this time."""
    log = cluster[0].log_path
    before = log.stat().st_size if log.exists() else 0
    process = cluster.spawn(0).process
    assert process is not None
    assert process.wait(60) == 2, cluster[0].log_tail()
    cluster[0].process = None
    with open(log, "rb") as file:
        file.seek(before)
        return file.read().decode(errors="replace")


async def test_an_unreadable_limbo_file_refuses_the_start_with_one_line(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    """Corrupt, a directory in its place, a symlink loop, no permission (unless root): exit 2,
    one line naming the file and what to do, no traceback; without the file it starts."""
    cluster = await bookie_cluster_factory(count=1, config=CONFIG)
    await cluster.stop(0)
    config_path = str(cluster[0].config_path)
    path = limbo_path(load_bookie_config(cluster[0].config_path), 0)
    good = LimboRecord(frozenset({10_000}), 100.0, "test").to_bytes()

    def corrupt() -> None:
        path.write_bytes(b"{garbage")

    def directory() -> None:
        path.mkdir()

    def loop() -> None:
        path.symlink_to(path.name)

    def no_permission() -> None:
        path.write_bytes(good)
        path.chmod(0)

    for make in (corrupt, directory, loop, no_permission):
        make()
        if os.access(path, os.R_OK) and make is no_permission:
            path.unlink()  # Root reads a mode-0 file.
            continue
        output = await asyncio.to_thread(_start_fails, cluster)
        assert "Traceback" not in output, (make.__name__, output)
        (line,) = [line for line in output.splitlines() if line.startswith("bkaio bookie: ")]
        assert line.startswith(f"bkaio bookie: {path}: unreadable limbo file ("), line
        assert "bkaio bookie format --force" in line, line
        # The offline `bkaio bookie info`, which lists limbo, says the same in one line.
        info = await asyncio.to_thread(bkaio, "bookie", "info", "--config", config_path)
        assert info.returncode == 1 and info.stdout == "", info
        refusal = f"bkaio: LimboFileError: {path}: unreadable limbo file ("
        assert info.stderr.startswith(refusal), info
        assert len(info.stderr.splitlines()) == 1, info.stderr
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink()
    await cluster.start(0, timeout_seconds=30)  # Nothing in limbo now.


async def test_recovery_adds_below_the_last_entry_are_answered(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    """What a limbo repair or a fill-in does: entries 0..4 after 5..9, and a pipelined mix of
    stored and new ones. (The add path once took every entry below the ledger's last one for
    stored, and looked again forever: no answer.)"""
    cluster = await bookie_cluster_factory(count=1, config=CONFIG)
    client = await RawClient.connect("127.0.0.1", cluster[0].port)
    ledger_id = 31

    def adds(entry_ids: range) -> list[Any]:
        return [
            add_request(client.next_id(), ledger_id, e, b"x%d" % e, flags=Flag.RECOVERY_ADD)
            for e in entry_ids
        ]

    try:
        for entry_ids in (range(5, 10), range(0, 5), range(0, 12)):
            answers = await client.pipeline(adds(entry_ids), timeout_seconds=20)
            assert {a.status for a in answers.values()} == {Status.OK}, entry_ids
        for entry_id in range(12):
            request = ReadEntryRequest(client.next_id(), ledger_id, entry_id, Flag.NONE, None)
            answer = await client.request(request)
            assert isinstance(answer, ReadEntryResponse) and answer.entry is not None
            assert answer.entry.payload == b"x%d" % entry_id
    finally:
        await client.close()
