"""How CLI commands print: human text by default, one JSON document with `--json`.

Owns nothing but formatting; commands hand it plain data (dicts, lists, scalars). Tables are
rich tables: boxed to the terminal's width on a terminal, plain aligned columns (never wrapped
or cut) when the output goes to a pipe or a file. Errors are printed by `emit_error`, on
stderr: one line of text, or with `--json` one JSON object `{"error": ..., "kind": ...}`.
A reader of stdout that goes away (`bkaio bookie readjournal F | head`) makes `emit` and
`emit_stream` raise `StdoutClosed`, on which the command stops quietly (bkaio/cli/main.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from bkaio.display import payload_text

__all__ = [
    "StdoutClosed",
    "emit",
    "emit_error",
    "emit_stream",
    "payload_text",
    "render_human",
    "table",
    "to_jsonable",
    "write_and_flush",
]


def to_jsonable(value: Any) -> Any:
    """Bytes become text or `hex:...`; tuples become lists; dataclasses must be converted first."""
    if isinstance(value, bytes):
        return payload_text(value)
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    return value


class StdoutClosed(Exception):
    """The reader of stdout went away (a pipe into `head`): nothing more can be shown.
    Deliberately no OSError: click ends a command on any EPIPE with a silent exit 1."""


@contextlib.contextmanager
def _writing_stdout() -> Iterator[None]:
    """Around writes to stdout: a broken pipe can only be stdout's (what else is written in
    the block is read from files), and means StdoutClosed."""
    try:
        yield
    except BrokenPipeError:
        raise StdoutClosed from None


def emit(data: Any, *, as_json: bool, human: str | None = None) -> None:
    """Print `data` as JSON, or `human` (falling back to a readable rendering of `data`)."""
    text = (
        json.dumps(to_jsonable(data), sort_keys=True)
        if as_json
        else (human if human is not None else render_human(data))
    )
    write_and_flush(text + "\n")


def write_and_flush(text: str) -> None:
    """Write `text` to stdout and flush it (StdoutClosed if its reader went away). Blocking on a
    slow reader: a command on an event loop runs it on a thread."""
    with _writing_stdout():
        sys.stdout.write(text)
        sys.stdout.flush()


def emit_stream(
    items: Iterable[Any],
    *,
    as_json: bool,
    human: Callable[[Any], str],
    key: str | None = None,
    trailer: Callable[[], Mapping[str, Any]] | None = None,
) -> None:
    """Print items as they come (a journal or entry log can be huge): one `human` line each,
    or one JSON document written incrementally: a list, or with `key` an object holding the
    list under `key` and then the fields `trailer()` returns once the items are exhausted."""
    with _writing_stdout():
        _write_stream(items, as_json=as_json, human=human, key=key, trailer=trailer)


def _write_stream(
    items: Iterable[Any],
    *,
    as_json: bool,
    human: Callable[[Any], str],
    key: str | None,
    trailer: Callable[[], Mapping[str, Any]] | None,
) -> None:
    out = sys.stdout
    if not as_json:
        for item in items:
            out.write(human(item) + "\n")
        out.flush()
        return
    out.write("{" + json.dumps(key) + ": [" if key is not None else "[")
    for count, item in enumerate(items):
        out.write(("," if count else "") + json.dumps(to_jsonable(item), sort_keys=True))
    out.write("]")
    if key is not None:
        for name, value in (trailer() if trailer is not None else {}).items():
            out.write(", " + json.dumps(name) + ": " + json.dumps(to_jsonable(value)))
        out.write("}")
    out.write("\n")
    out.flush()


def render_human(data: Any) -> str:
    if isinstance(data, Mapping):
        width = max((len(str(key)) for key in data), default=0)
        return "\n".join(f"{key!s:<{width}}  {to_jsonable(value)}" for key, value in data.items())
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return "\n".join(render_human(item) for item in data)
    return str(to_jsonable(data))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The rows as a rich table of `columns` (headers upper-cased); "(none)" without rows."""
    if not rows:
        return "(none)"
    terminal = sys.stdout.isatty()
    rendered = Table(
        box=box.SIMPLE_HEAD if terminal else None,
        show_edge=False,
        pad_edge=False,
        header_style="bold" if terminal else "",
    )
    for column in columns:
        rendered.add_column(column.upper(), overflow="fold", no_wrap=not terminal)
    for row in rows:
        rendered.add_row(*(_cell(row.get(column)) for column in columns))
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=None if terminal else 100_000,  # A pipe gets whole lines, whatever their length.
        force_terminal=terminal,
        no_color=not terminal,
        highlight=False,
        emoji=False,
        markup=False,
    )
    console.print(rendered)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines() if line.strip())


def _cell(value: Any) -> str:
    if value is None:
        return ""
    plain = to_jsonable(value)
    if isinstance(plain, list | dict):
        return json.dumps(plain, sort_keys=True)
    return str(plain)


def emit_error(message: str, kind: str, *, as_json: bool) -> None:
    """An expected failure, on stderr: `bkaio: KIND: message` or, with --json, one JSON object
    `{"error": message, "kind": KIND}` (the exit code is the caller's, the same either way)."""
    one_line = " ".join(message.split())
    if as_json:
        sys.stderr.write(json.dumps({"error": one_line, "kind": kind}) + "\n")
    else:
        sys.stderr.write(f"bkaio: {kind}: {one_line}\n")
    sys.stderr.flush()
