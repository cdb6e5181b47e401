"""Ledgers of one shard spread over every disk and journal, whatever the shard count."""

from __future__ import annotations

from pathlib import Path

from tests.unit.entrylog.conftest import make_config


def test_one_shard_of_two_uses_both_disks_and_both_journals(tmp_path: Path) -> None:
    config = make_config(tmp_path, disks=2, journals=2, ledger_stride=2)
    shard_zero_ledgers = range(0, 40, 2)  # Shard 0 of 2 only ever sees even ledger ids.
    assert {config.disk_of(ledger_id) for ledger_id in shard_zero_ledgers} == {0, 1}
    assert {config.journal_of(ledger_id) for ledger_id in shard_zero_ledgers} == {0, 1}


def test_stride_one_is_plain_round_robin(tmp_path: Path) -> None:
    config = make_config(tmp_path, disks=3)
    assert [config.disk_of(ledger_id) for ledger_id in range(6)] == [0, 1, 2, 0, 1, 2]
