"""`bkaio shell readledger` prints entries as they are read (bkaio/cli/shell.py, print_entries):
a whole ledger, its default, was kept in memory until the end, so a large one would take as
much memory as its entries. The text and the JSON document are the same as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from bkaio.cli.shell import PRINT_BATCH_ENTRIES, print_entries
from bkaio.errors import NoSuchEntryError


@dataclass(frozen=True)
class FakeEntry:
    entry_id: int
    payload: bytes


async def entries_of(payloads: list[bytes]) -> AsyncIterator[FakeEntry]:
    for entry_id, payload in enumerate(payloads):
        yield FakeEntry(entry_id, payload)


async def test_text_and_json_are_what_they_were(capsys: pytest.CaptureFixture[str]) -> None:
    payloads = [b"e0", b"e1", b"\x00\xff bin"]
    assert await print_entries(entries_of(payloads), as_json=False) == 3
    assert capsys.readouterr().out == "0\te0\n1\te1\n2\thex:00ff2062696e\n"
    await print_entries(entries_of(payloads), as_json=True)
    text = capsys.readouterr().out
    assert text == json.dumps(
        [{"entry_id": 0, "payload": "e0"}, {"entry_id": 1, "payload": "e1"},
         {"entry_id": 2, "payload": "hex:00ff2062696e"}], sort_keys=True,
    ) + "\n"  # fmt: skip
    for as_json, shown in ((False, "(no entries)\n"), (True, "[]\n")):
        assert await print_entries(entries_of([]), as_json=as_json) == 0
        assert capsys.readouterr().out == shown


@pytest.mark.parametrize("as_json", [False, True])
async def test_entries_are_printed_as_they_come(
    capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    total = 5000
    shown, unprinted_at_most = "", 0

    async def watched() -> AsyncIterator[FakeEntry]:
        nonlocal shown, unprinted_at_most
        for entry_id in range(total):
            shown += capsys.readouterr().out
            printed = shown.count('"entry_id"' if as_json else "\n")
            unprinted_at_most = max(unprinted_at_most, entry_id - printed)
            yield FakeEntry(entry_id, b"x" * 100)

    assert await print_entries(watched(), as_json=as_json) == total
    assert unprinted_at_most <= PRINT_BATCH_ENTRIES <= 1000
    shown += capsys.readouterr().out
    if as_json:
        assert [row["entry_id"] for row in json.loads(shown)] == list(range(total))
    else:
        assert shown.count("\n") == total


async def test_a_read_failing_part_way_leaves_what_was_read_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def failing() -> AsyncIterator[FakeEntry]:
        async for entry in entries_of([b"a", b"b"]):
            yield entry
        raise NoSuchEntryError("ledger 7: entry 2 is absent")

    with pytest.raises(NoSuchEntryError):
        await print_entries(failing(), as_json=False)
    assert capsys.readouterr().out == "0\ta\n1\tb\n"
