"""Randomized replay checks: whatever the cut or the damage, replay never invents records."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bkaio.journal import EntryRecord, JournalReader, ReplayResult, encode_record
from bkaio.journal.files import HEADER_BYTES, encode_header, file_name

payloads = st.lists(st.binary(max_size=64), min_size=1, max_size=12)


def journal_bytes(payload_list: list[bytes]) -> tuple[bytes, list[EntryRecord], list[int]]:
    records = [EntryRecord(3, i, i - 1, i, 0, payload) for i, payload in enumerate(payload_list)]
    content = bytearray(encode_header(1))
    ends = []
    for record in records:
        content += encode_record(record)
        ends.append(len(content))
    return bytes(content), records, ends


def replay_bytes(content: bytes) -> ReplayResult:
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / file_name(1)).write_bytes(content)
        return JournalReader(Path(directory), [1], None).result()


@settings(max_examples=150, deadline=None)
@given(payload_list=payloads, data=st.data())
def test_a_cut_anywhere_replays_exactly_the_whole_records_before_it(
    payload_list: list[bytes], data: st.DataObject
) -> None:
    content, records, ends = journal_bytes(payload_list)
    cut = data.draw(st.integers(HEADER_BYTES, len(content)), label="cut")
    result = replay_bytes(content[:cut])
    whole = sum(1 for end in ends if end <= cut)
    assert [record for _mark, record in result.records] == records[:whole]
    assert result.corruption == []
    assert (result.torn_tail is None) == (cut in (HEADER_BYTES, *ends))


@settings(max_examples=150, deadline=None)
@given(payload_list=payloads, data=st.data())
def test_damage_anywhere_loses_only_the_damaged_record(
    payload_list: list[bytes], data: st.DataObject
) -> None:
    content, records, ends = journal_bytes(payload_list)
    index = data.draw(st.integers(HEADER_BYTES, len(content) - 1), label="damaged byte")
    damaged = bytearray(content)
    damaged[index] ^= data.draw(st.integers(1, 255), label="xor")
    result = replay_bytes(bytes(damaged))
    hit = next(i for i, end in enumerate(ends) if index < end)
    expected = [record for i, record in enumerate(records) if i != hit]
    assert [record for _mark, record in result.records] == expected
    is_last = hit == len(records) - 1
    assert (result.torn_tail is not None) == is_last
    assert len(result.corruption) == (0 if is_last else 1)
