"""How CLI commands print: human text by default, one JSON document with `--json`.

Owns nothing but formatting; commands hand it plain data (dicts, lists, scalars).
"""

from __future__ import annotations

import json
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Any

_PRINTABLE = frozenset(string.printable) - frozenset("\x0b\x0c")


def payload_text(payload: bytes) -> str:
    """A payload shown safely: its UTF-8 text when printable, else `hex:` and the bytes in hex."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + payload.hex()
    if all(ch in _PRINTABLE or (ch.isprintable() and not ch.isspace()) for ch in text):
        return text
    return "hex:" + payload.hex()


def to_jsonable(value: Any) -> Any:
    """Bytes become text or `hex:...`; tuples become lists; dataclasses must be converted first."""
    if isinstance(value, bytes):
        return payload_text(value)
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    return value


def emit(data: Any, *, as_json: bool, human: str | None = None) -> None:
    """Print `data` as JSON, or `human` (falling back to a readable rendering of `data`)."""
    if as_json:
        sys.stdout.write(json.dumps(to_jsonable(data), sort_keys=True) + "\n")
    else:
        sys.stdout.write((human if human is not None else render_human(data)) + "\n")
    sys.stdout.flush()


def render_human(data: Any) -> str:
    if isinstance(data, Mapping):
        width = max((len(str(key)) for key in data), default=0)
        return "\n".join(f"{key!s:<{width}}  {to_jsonable(value)}" for key, value in data.items())
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return "\n".join(render_human(item) for item in data)
    return str(to_jsonable(data))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A plain aligned text table; empty when there are no rows."""
    if not rows:
        return "(none)"
    cells = [[str(to_jsonable(row.get(column, ""))) for column in columns] for row in rows]
    widths = [
        max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)
    ]
    header = "  ".join(column.upper().ljust(widths[i]) for i, column in enumerate(columns))
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)) for line in cells]
    return "\n".join([header, *lines])
