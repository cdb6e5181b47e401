"""The history checker finds each kind of violation, and accepts correct but messy histories."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.errors import BKTimeoutError, LedgerFencedError, NoSuchEntryError
from bkaio.testing.checker import check
from bkaio.testing.history import History, Invocation, OpType, load, load_file


def _add(h: History, value: str, entry: int | None, *, ledger: int = 1, process: str = "w") -> None:
    inv = h.invoke(process, "add", ledger, value=value)
    if entry is None:
        h.failed(inv, BKTimeoutError("timed out"))
    else:
        h.ok(inv, entry=entry)


def _seal(h: History, last: int, *, ledger: int = 1, process: str = "r") -> None:
    h.ok(h.invoke(process, "seal", ledger), value=last)


def _final_reads(h: History, values: list[str], *, ledger: int = 1) -> None:
    for entry, value in enumerate(values):
        inv = h.invoke("final", "read", ledger, entry=entry, extra={"final": True})
        h.ok(inv, value=value)


def _clean() -> History:
    h = History()
    _add(h, "a", 0)
    _add(h, "b", 1)
    _seal(h, 1)
    _final_reads(h, ["a", "b"])
    return h


def test_a_clean_history_is_valid() -> None:
    result = check(_clean().ops)
    assert result.valid, result.summary()
    assert result.stats["acknowledged"] == 2 and result.lost == 0


def test_indeterminate_and_failed_adds_may_or_may_not_appear() -> None:
    h = History()
    _add(h, "a", 0)
    _add(h, "b", None)  # Timed out: present in the end ("recovered").
    inv = h.invoke("w", "add", 1, value="c")
    h.failed(inv, LedgerFencedError("fenced"))  # Failed; absent in the end.
    _seal(h, 1)
    _final_reads(h, ["a", "b"])
    result = check(h.ops)
    assert result.valid, result.summary()
    assert result.stats["recovered"] == 1
    assert result.stats["indeterminate"] == 1 and result.stats["failed"] == 1


def test_timeouts_are_info_never_failures() -> None:
    h = History()
    inv = h.invoke("w", "add", 1, value="a")
    op = h.failed(inv, BKTimeoutError("no quorum"))
    assert op.type is OpType.INFO
    op = h.failed(h.invoke("r", "read", 1, entry=0), NoSuchEntryError("no"))
    assert op.type is OpType.FAIL and op.error == "no_such_entry"


def test_lost_acked_write_below_seal() -> None:
    h = History()
    _add(h, "a", 0)
    _add(h, "b", 1)
    _seal(h, 0)
    result = check(h.ops)
    assert result.kinds() == {"lost-acked-write"} and result.lost == 1


def test_lost_acked_write_when_final_read_has_other_bytes() -> None:
    h = History()
    _add(h, "a", 0)
    _add(h, "x", None)
    _seal(h, 0)
    _final_reads(h, ["x"])
    assert "lost-acked-write" in check(h.ops).kinds()


def test_seal_disagreement() -> None:
    h = _clean()
    _seal(h, 2, process="r2")
    assert "seal-disagreement" in check(h.ops).kinds()


def test_read_past_seal_and_past_lac() -> None:
    h = _clean()
    h.ok(h.invoke("t", "read", 1, entry=2), value="b")
    inv = h.invoke("t", "read", 1, entry=1, extra={"lac": 0})
    h.ok(inv, value="b")
    kinds = check(h.ops).kinds()
    assert {"read-past-seal", "read-past-lac"} <= kinds


def test_two_payloads_for_one_entry() -> None:
    h = _clean()
    _add(h, "z", None)
    h.ok(h.invoke("t", "read", 1, entry=1), value="z")
    kinds = check(h.ops).kinds()
    assert "divergent-payload" in kinds and "wrong-entry" not in kinds


def test_phantom_and_wrong_entry() -> None:
    h = _clean()
    h.ok(h.invoke("t", "read", 1, entry=0), value="never-written")
    h.ok(h.invoke("t", "read", 1, entry=1), value="a")
    kinds = check(h.ops).kinds()
    assert {"phantom-payload", "wrong-entry"} <= kinds


def test_hole_in_final_reads() -> None:
    h = History()
    _add(h, "a", 0)
    _add(h, "b", 1)
    _add(h, "c", 2)
    _seal(h, 2)
    for entry, value in ((0, "a"), (2, "c")):
        h.ok(h.invoke("f", "read", 1, entry=entry, extra={"final": True}), value=value)
    assert check(h.ops).kinds() == {"hole"}


def test_no_such_entry_for_committed_entries() -> None:
    h = History()
    _add(h, "a", 0)
    h.failed(h.invoke("t", "read", 1, entry=0), NoSuchEntryError("no"))
    assert check(h.ops, require_final=False).kinds() == {"no-such-entry-for-committed"}
    # A negative for an entry beyond the LAC of an open ledger is fine.
    h2 = History()
    h2.failed(h2.invoke("t", "read", 1, entry=5), NoSuchEntryError("no"))
    assert check(h2.ops).valid


def test_negative_after_seal_observed() -> None:
    h = History()
    _add(h, "a", None)
    _seal(h, 0)
    h.failed(h.invoke("t", "read", 1, entry=0), NoSuchEntryError("no"))
    assert "no-such-entry-for-committed" in check(h.ops).kinds()


def test_add_acknowledged_after_seal() -> None:
    h = History()
    _add(h, "a", 0)
    _seal(h, 1)
    _add(h, "b", 1)
    assert "add-acked-after-seal" in check(h.ops).kinds()


def test_add_in_flight_at_seal_may_succeed_within_it() -> None:
    h = History()
    inv = h.invoke("w", "add", 1, value="a")
    _seal(h, 0)
    h.ok(inv, entry=0)
    _final_reads(h, ["a"])
    assert check(h.ops).valid


def test_acks_out_of_order_and_entry_order() -> None:
    h = History()
    first = h.invoke("w", "add", 1, value="a")
    second = h.invoke("w", "add", 1, value="b")
    h.ok(second, entry=1)
    h.ok(first, entry=0)
    assert check(h.ops, require_final=False).kinds() == {"ack-out-of-order"}
    h2 = History()
    first = h2.invoke("w", "add", 1, value="a")
    second = h2.invoke("w", "add", 1, value="b")
    h2.ok(first, entry=1)
    h2.ok(second, entry=0)
    assert "entry-order" in check(h2.ops, require_final=False).kinds()


def test_duplicate_entry_id() -> None:
    h = History()
    _add(h, "a", 0, process="w1")
    _add(h, "b", 0, process="w2")
    assert "duplicate-entry-id" in check(h.ops, require_final=False).kinds()


def test_lac_past_seal() -> None:
    h = _clean()
    h.ok(h.invoke("t", "read_lac", 1), value=5)
    assert check(h.ops).kinds() == {"lac-past-seal"}


def test_unsealed_ledger_is_liveness_not_safety() -> None:
    h = History()
    _add(h, "a", 0)
    result = check(h.ops)
    assert result.valid and result.liveness


def test_jsonl_round_trip(tmp_path: Path) -> None:
    h = _clean()
    h.invoke("w", "add", 1, value="open")
    h.close_open()
    path = tmp_path / "history.jsonl"
    path.write_text(h.to_jsonl())
    loaded = load_file(path)
    assert [(o.index, o.type, o.op, o.value, o.entry) for o in loaded] == [
        (o.index, o.type, o.op, o.value, o.entry) for o in h.ops
    ]
    assert check(loaded).valid


def test_completing_twice_is_a_bug() -> None:
    h = History()
    inv = h.invoke("w", "add", 1, value="a")
    h.ok(inv, entry=0)
    with pytest.raises(AssertionError):
        h.ok(inv, entry=0)
    with pytest.raises(ValueError, match="bad history line"):
        load(['{"index": "x"}'])
    assert isinstance(inv, Invocation)
