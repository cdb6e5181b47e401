from __future__ import annotations

import json

import pytest

from bkaio.cli.main import main
from bkaio.cli.output import emit, emit_error, emit_stream, payload_text, table


@pytest.mark.parametrize(
    ("payload", "shown"),
    [
        (b"hello world", "hello world"),
        (b"caf\xc3\xa9", "café"),
        (b"\x00\x01\xff", "hex:0001ff"),
        (b"bell\x07", "hex:62656c6c07"),
        (b"", ""),
    ],
)
def test_payloads_are_shown_as_text_only_when_printable(payload: bytes, shown: str) -> None:
    assert payload_text(payload) == shown


def test_json_output_turns_bytes_into_safe_text(capsys: pytest.CaptureFixture[str]) -> None:
    emit({"payload": b"\xff", "ids": (1, 2)}, as_json=True)
    assert json.loads(capsys.readouterr().out) == {"payload": "hex:ff", "ids": [1, 2]}


def test_table_aligns_columns_and_says_when_empty() -> None:
    rendered = table([{"a": 1, "b": "xyz"}, {"a": 22, "b": ""}], ["a", "b"])
    assert rendered.splitlines()[0].split() == ["A", "B"]
    assert table([], ["a"]) == "(none)"


def test_bad_arguments_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["shell", "readledger", "not-a-number", "--metadata", "sqlite:////tmp/x.db"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "not-a-number" in err


def test_missing_metadata_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BKAIO_METADATA", raising=False)
    code = main(["shell", "listledgers"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--metadata" in err


def test_piped_tables_keep_long_cells_whole() -> None:
    long = "x" * 300
    rendered = table([{"a": long, "b": [1, 2], "c": None}], ["a", "b", "c"])
    header, row = rendered.splitlines()
    assert header.split() == ["A", "B", "C"]
    assert row.split() == [long, "[1, 2]"] or row.split()[0] == long


def test_streamed_json_is_one_document(capsys: pytest.CaptureFixture[str]) -> None:
    emit_stream(iter([{"p": b"\xff"}, {"p": b"ok"}]), as_json=True, human=str)
    assert json.loads(capsys.readouterr().out) == [{"p": "hex:ff"}, {"p": "ok"}]
    emit_stream(iter([1, 2]), as_json=True, human=str, key="records", trailer=lambda: {"count": 2})
    assert json.loads(capsys.readouterr().out) == {"records": [1, 2], "count": 2}
    emit_stream(iter([]), as_json=True, human=str, key="records", trailer=dict)
    assert json.loads(capsys.readouterr().out) == {"records": []}
    emit_stream(iter([1, 2]), as_json=False, human=lambda n: f"n={n}")
    assert capsys.readouterr().out == "n=1\nn=2\n"


def test_errors_print_as_text_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    emit_error("two\nlines", "SomeError", as_json=False)
    assert capsys.readouterr().err == "bkaio: SomeError: two lines\n"
    emit_error("bad", "SomeError", as_json=True)
    assert json.loads(capsys.readouterr().err) == {"error": "bad", "kind": "SomeError"}
