"""Operation histories for fault tests: every client operation as invoke / ok / fail / info.

One `History` per test run. Workload drivers call `invoke` *before* the request leaves and one of
`ok`, `fail` or `info` *after* the result is known; the recorder is used from one event loop, so
the index (arrival order) is the real-time order of those calls. `save` writes JSON Lines:

    {"index": 7, "type": "invoke", "process": "w0", "f": "add", "op": 3, "ledger": 12,
     "entry": null, "value": "w0-12-3-9f1c", "time": 1.25, "error": null, "extra": {}}

`op` ties a completion to its invocation. Operations (`f`) and what their fields mean:

| f        | invoke                   | ok                                        |
| ---      | ---                      | ---                                       |
| add      | ledger, value (payload)  | entry (the id the writer assigned)        |
| read     | ledger, entry            | value (payload read); extra.lac if bounded|
| read_lac | ledger                   | value (the LAC, an int)                   |
| seal     | ledger                   | value (last_entry_id a client observed    |
|          |                          |   on a CLOSED ledger: recovery, close,    |
|          |                          |   metadata read)                          |
| close    | ledger                   | value (last_entry_id of the writer close) |

Outcome mapping (reference/faults.md B1): `LedgerFencedError`, `LedgerClosedError`,
`UnauthorizedError` are definite failures; `NoSuchEntryError` on a read is a failure with
error "no_such_entry"; timeouts, lost connections and anything unknown are **info**
(indeterminate: the operation may or may not have taken effect).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar

from bkaio.errors import (
    BKError,
    EntryConflictError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)

T = TypeVar("T")


class OpType(StrEnum):
    INVOKE = "invoke"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


Function = Literal["add", "read", "read_lac", "seal", "close"]
FUNCTIONS: frozenset[str] = frozenset({"add", "read", "read_lac", "seal", "close"})

NO_SUCH_ENTRY = "no_such_entry"


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a history."""

    index: int
    type: OpType
    process: str
    f: str
    op: int  # Shared by an invocation and its completion.
    ledger: int
    entry: int | None = None
    value: Any = None
    time: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "index": self.index,
                "type": self.type.value,
                "process": self.process,
                "f": self.f,
                "op": self.op,
                "ledger": self.ledger,
                "entry": self.entry,
                "value": self.value,
                "time": round(self.time, 6),
                "error": self.error,
                "extra": self.extra,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, line: str) -> Op:
        raw = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError(f"history line is not a JSON object: {line[:80]!r}")
        try:
            return cls(
                index=int(raw["index"]),
                type=OpType(raw["type"]),
                process=str(raw["process"]),
                f=str(raw["f"]),
                op=int(raw["op"]),
                ledger=int(raw["ledger"]),
                entry=None if raw.get("entry") is None else int(raw["entry"]),
                value=raw.get("value"),
                time=float(raw.get("time", 0.0)),
                error=raw.get("error"),
                extra=dict(raw.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"bad history line {line[:80]!r}: {error}") from None


def classify(error: BaseException) -> tuple[OpType, str]:
    """How an exception ends an operation: (FAIL or INFO, short error name)."""
    if isinstance(error, NoSuchEntryError):
        return OpType.FAIL, NO_SUCH_ENTRY
    if isinstance(
        error,
        LedgerFencedError
        | LedgerClosedError
        | UnauthorizedError
        | NoSuchLedgerError
        | EntryConflictError,
    ):
        return OpType.FAIL, type(error).__name__
    if isinstance(error, BKError | OSError | asyncio.TimeoutError):
        return OpType.INFO, type(error).__name__
    return OpType.INFO, type(error).__name__


@dataclass(frozen=True, slots=True)
class Invocation:
    """Handle for completing one invoked operation."""

    op: int
    process: str
    f: str
    ledger: int
    entry: int | None


class History:
    """Records operations in arrival order; one per test run, used from one event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._ops: list[Op] = []
        self._next_op = 0
        self._open: dict[int, Invocation] = {}
        self._clock = clock  # The simulator passes its virtual clock.
        self._start = clock()

    # ----------------------------------------------------------------- recording

    def _append(
        self,
        kind: OpType,
        inv: Invocation,
        *,
        entry: int | None,
        value: Any,
        error: str | None,
        extra: dict[str, Any] | None,
    ) -> Op:
        op = Op(
            index=len(self._ops),
            type=kind,
            process=inv.process,
            f=inv.f,
            op=inv.op,
            ledger=inv.ledger,
            entry=entry,
            value=value,
            time=self._clock() - self._start,
            error=error,
            extra=dict(extra or {}),
        )
        self._ops.append(op)
        return op

    def invoke(
        self,
        process: str,
        f: Function,
        ledger: int,
        *,
        entry: int | None = None,
        value: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> Invocation:
        assert f in FUNCTIONS, f
        inv = Invocation(self._next_op, process, f, ledger, entry)
        self._next_op += 1
        self._open[inv.op] = inv
        self._append(OpType.INVOKE, inv, entry=entry, value=value, error=None, extra=extra)
        return inv

    def _complete(
        self,
        kind: OpType,
        inv: Invocation,
        entry: int | None,
        value: Any,
        error: str | None,
        extra: dict[str, Any] | None,
    ) -> Op:
        assert self._open.pop(inv.op, None) is inv, f"operation {inv.op} completed twice"
        return self._append(
            kind,
            inv,
            entry=inv.entry if entry is None else entry,
            value=value,
            error=error,
            extra=extra,
        )

    def ok(
        self,
        inv: Invocation,
        *,
        entry: int | None = None,
        value: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> Op:
        return self._complete(OpType.OK, inv, entry, value, None, extra)

    def fail(
        self, inv: Invocation, error: str, *, value: Any = None, extra: dict[str, Any] | None = None
    ) -> Op:
        return self._complete(OpType.FAIL, inv, None, value, error, extra)

    def info(
        self, inv: Invocation, error: str, *, value: Any = None, extra: dict[str, Any] | None = None
    ) -> Op:
        return self._complete(OpType.INFO, inv, None, value, error, extra)

    def failed(self, inv: Invocation, error: BaseException, *, value: Any = None) -> Op:
        """Complete `inv` with an exception, mapped by `classify`."""
        kind, name = classify(error)
        extra = {"message": str(error)[:200]}
        if kind is OpType.FAIL:
            return self.fail(inv, name, value=value, extra=extra)
        return self.info(inv, name, value=value, extra=extra)

    async def run(self, inv: Invocation, operation: Awaitable[T]) -> T | None:
        """Await `operation` and complete `inv`: ok with no fields, or by its exception (None)."""
        try:
            result = await operation
        except asyncio.CancelledError:
            self.info(inv, "cancelled")
            raise
        except Exception as error:
            self.failed(inv, error)
            return None
        self.ok(inv)
        return result

    def close_open(self, reason: str = "unfinished") -> None:
        """End every invocation still open as info (the run stopped before it finished)."""
        for inv in list(self._open.values()):
            self.info(inv, reason)

    # ----------------------------------------------------------------- reading

    @property
    def ops(self) -> list[Op]:
        return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(list(self._ops))

    def __len__(self) -> int:
        return len(self._ops)

    def counts(self) -> dict[str, int]:
        """Completions by f and type, e.g. {"add.ok": 900, "add.info": 3}."""
        out: dict[str, int] = {}
        for op in self._ops:
            if op.type is not OpType.INVOKE:
                key = f"{op.f}.{op.type.value}"
                out[key] = out.get(key, 0) + 1
        return out

    def to_jsonl(self) -> str:
        return "".join(op.to_json() + "\n" for op in self._ops)

    async def save(self, path: Path) -> None:
        """Write the history as JSON Lines (in a thread: file I/O stays off the loop)."""
        text = self.to_jsonl()
        await asyncio.to_thread(path.write_text, text)


def load(lines: Iterable[str]) -> list[Op]:
    """Parse JSON Lines back into ops (blank lines ignored)."""
    return [Op.from_json(line) for line in lines if line.strip()]


def load_file(path: Path) -> list[Op]:
    """Blocking: for offline analysis and the soak runner's post-processing."""
    with path.open() as file:
        return load(file)
