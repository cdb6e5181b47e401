"""An independent checker for ledger histories (bkaio.testing.history).

It knows nothing about bookies or the client: only the recorded operations and the guarantees of
reference/faults.md A1 (G1-G4). `check(ops)` returns every violation it finds:

| kind                          | meaning                                                      |
| ---                           | ---                                                          |
| lost-acked-write              | an add was acknowledged at e, but the ledger sealed below e, |
|                               | or the final read of the sealed ledger did not return it     |
| seal-disagreement             | clients observed two different last entry ids for a ledger   |
| read-past-seal                | a read returned an entry above the sealed last entry         |
| read-past-lac                 | a tailing read returned an entry above the LAC it was bound  |
|                               | by (extra.lac)                                               |
| lac-past-seal                 | a LAC read returned a value above the sealed last entry      |
| divergent-payload             | two different payloads for one (ledger, entry)               |
| duplicate-entry-id            | two acknowledged adds got the same entry id                  |
| wrong-entry                   | a payload acknowledged at e was read at another id           |
| phantom-payload               | a read returned a payload no add of that ledger sent         |
| hole                          | an entry <= the seal was never returned by the final reads   |
| no-such-entry-for-committed   | a definite "no such entry" for an entry acknowledged before  |
|                               | the read began, or <= a seal observed before it began        |
| add-acked-after-seal          | an add invoked after a seal was observed was acknowledged    |
| ack-out-of-order              | one writer's acks on a ledger completed out of entry order   |
| entry-order                   | a later add of a writer got a lower entry id than an earlier |

Timeouts and unknown outcomes (info) are never violations: such an add may or may not be in the
ledger, and so may a *failed* add ("recovered" in Jepsen's words). Ledgers that were never
observed sealed although entries were acknowledged are reported under `liveness` (the final
phase did not finish), separately from safety.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bkaio.testing.history import NO_SUCH_ENTRY, Op, OpType

KINDS: tuple[str, ...] = (
    "lost-acked-write",
    "seal-disagreement",
    "read-past-seal",
    "read-past-lac",
    "lac-past-seal",
    "divergent-payload",
    "duplicate-entry-id",
    "wrong-entry",
    "phantom-payload",
    "hole",
    "no-such-entry-for-committed",
    "add-acked-after-seal",
    "ack-out-of-order",
    "entry-order",
)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    ledger: int
    entry: int | None
    detail: str
    ops: tuple[int, ...] = ()  # History indexes that show it.

    def __str__(self) -> str:
        where = f"ledger {self.ledger}" + ("" if self.entry is None else f" entry {self.entry}")
        return f"{self.kind}: {where}: {self.detail} (ops {list(self.ops)})"


@dataclass(frozen=True, slots=True)
class CheckResult:
    violations: tuple[Violation, ...]
    liveness: tuple[str, ...]
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def lost(self) -> int:
        return sum(1 for v in self.violations if v.kind == "lost-acked-write")

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def summary(self, limit: int = 20) -> str:
        lines = [f"stats: {self.stats}"]
        lines += [f"VIOLATION {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more violations")
        lines += [f"liveness: {item}" for item in self.liveness[:limit]]
        return "\n".join(lines)


@dataclass
class _Ledger:
    invoked_values: dict[Any, Op] = field(default_factory=dict)  # add value -> invocation
    add_outcome: dict[Any, Op] = field(default_factory=dict)  # add value -> completion
    acked: dict[int, Op] = field(default_factory=dict)  # entry -> add ok
    seals: list[Op] = field(default_factory=list)  # seal/close ok ops
    reads: list[tuple[Op, Op]] = field(default_factory=list)  # (invoke, completion)
    lac_reads: list[Op] = field(default_factory=list)
    seen: dict[int, dict[Any, list[int]]] = field(default_factory=dict)  # entry -> value -> ops


def check(ops: Iterable[Op], *, require_final: bool = True) -> CheckResult:
    """Check a history. `require_final`: every ledger with acked entries must be seen sealed."""
    history = sorted(ops, key=lambda op: op.index)
    invocations: dict[int, Op] = {}
    ledgers: dict[int, _Ledger] = defaultdict(_Ledger)
    per_writer: dict[tuple[str, int], list[tuple[Op, Op]]] = defaultdict(list)
    stats = {"ops": 0, "adds": 0, "acknowledged": 0, "failed": 0, "indeterminate": 0}
    for op in history:
        ledger = ledgers[op.ledger]
        if op.type is OpType.INVOKE:
            invocations[op.op] = op
            if op.f == "add":
                stats["adds"] += 1
                ledger.invoked_values[op.value] = op
            continue
        stats["ops"] += 1
        invoke = invocations.get(op.op)
        if invoke is None:
            raise ValueError(f"history index {op.index}: completion of op {op.op} never invoked")
        if op.f == "add":
            ledger.add_outcome[invoke.value] = op
            if op.type is OpType.OK:
                stats["acknowledged"] += 1
                assert op.entry is not None, op
                per_writer[(op.process, op.ledger)].append((invoke, op))
                ledger.seen.setdefault(op.entry, {}).setdefault(invoke.value, []).append(op.index)
                ledger.acked.setdefault(op.entry, op)
            elif op.type is OpType.FAIL:
                stats["failed"] += 1
            else:
                stats["indeterminate"] += 1
        elif op.f == "read":
            ledger.reads.append((invoke, op))
            if op.type is OpType.OK and op.entry is not None:
                ledger.seen.setdefault(op.entry, {}).setdefault(op.value, []).append(op.index)
        elif op.f == "read_lac" and op.type is OpType.OK:
            ledger.lac_reads.append(op)
        elif op.f in ("seal", "close") and op.type is OpType.OK:
            ledger.seals.append(op)

    violations: list[Violation] = []
    liveness: list[str] = []
    recovered = 0
    for ledger_id in sorted(ledgers):
        ledger = ledgers[ledger_id]
        recovered += _check_ledger(
            ledger_id, ledger, invocations, violations, liveness, require_final
        )
    for (process, ledger_id), adds in sorted(per_writer.items()):
        _check_writer_order(process, ledger_id, adds, violations)
    stats["recovered"] = recovered
    stats["lost"] = sum(1 for v in violations if v.kind == "lost-acked-write")
    stats["violations"] = len(violations)
    return CheckResult(tuple(violations), tuple(liveness), stats)


def _check_ledger(
    ledger_id: int,
    ledger: _Ledger,
    invocations: dict[int, Op],
    violations: list[Violation],
    liveness: list[str],
    require_final: bool,
) -> int:
    """Append this ledger's violations; return how many failed/unknown adds were found in it."""

    def report(kind: str, entry: int | None, detail: str, *ops: int) -> None:
        violations.append(Violation(kind, ledger_id, entry, detail, tuple(ops)))

    # G3: one end.
    ends = sorted({int(op.value) for op in ledger.seals})
    if len(ends) > 1:
        report(
            "seal-disagreement",
            None,
            f"observed last entry ids {ends}",
            *(op.index for op in ledger.seals),
        )
    sealed: int | None = ends[0] if ends else None
    first_seal_index = min((op.index for op in ledger.seals), default=None)

    # G2: one payload per id, and every payload where it was written.
    value_entry: dict[Any, int] = {}
    for entry, values in sorted(ledger.seen.items()):
        if len(values) > 1:
            shown = sorted(str(v)[:40] for v in values)
            indexes = sorted(i for found in values.values() for i in found)
            report("divergent-payload", entry, f"payloads {shown}", *indexes[:6])
        for value, indexes in values.items():
            if value not in ledger.invoked_values:
                report(
                    "phantom-payload",
                    entry,
                    f"payload {str(value)[:40]!r} never added",
                    *indexes[:3],
                )
                continue
            other = value_entry.setdefault(value, entry)
            if other != entry:
                report(
                    "wrong-entry",
                    entry,
                    f"payload {str(value)[:40]!r} also at entry {other}",
                    *indexes[:3],
                )
    acks_by_entry: dict[int, list[Op]] = defaultdict(list)
    for op in ledger.add_outcome.values():
        if op.type is OpType.OK and op.entry is not None:
            acks_by_entry[op.entry].append(op)
    for entry, acks in sorted(acks_by_entry.items()):
        if len(acks) > 1:
            report(
                "duplicate-entry-id",
                entry,
                f"{len(acks)} acknowledged adds got this id",
                *(op.index for op in acks[:4]),
            )

    # G1: acknowledged entries stay, up to the seal.
    final_reads_ok: dict[int, Op] = {}
    final_reads_any: set[int] = set()
    for invoke, done in ledger.reads:
        if invoke.extra.get("final") and invoke.entry is not None:
            final_reads_any.add(invoke.entry)
            if done.type is OpType.OK:
                final_reads_ok[invoke.entry] = done
    if sealed is not None:
        for entry, add in sorted(ledger.acked.items()):
            if entry > sealed:
                report(
                    "lost-acked-write",
                    entry,
                    f"acknowledged but sealed at {sealed}",
                    add.index,
                    *(op.index for op in ledger.seals[:2]),
                )
        if final_reads_any:
            missing = [e for e in range(sealed + 1) if e not in final_reads_any]
            if missing:
                report(
                    "hole",
                    missing[0],
                    f"{len(missing)} entries <= {sealed} never read "
                    f"in the final phase (first {missing[:5]})",
                )
            for entry, add in sorted(ledger.acked.items()):
                got = final_reads_ok.get(entry)
                add_value = invocations[add.op].value if add.op in invocations else None
                if entry <= sealed and got is not None and got.value != add_value:
                    report(
                        "lost-acked-write",
                        entry,
                        "final read returned another payload",
                        add.index,
                        got.index,
                    )
    elif ledger.acked and require_final:
        liveness.append(
            f"ledger {ledger_id}: {len(ledger.acked)} acknowledged entries but never seen sealed"
        )

    # Reads bounded by the seal and by the LAC they were given.
    for invoke, done in ledger.reads:
        read_id = invoke.entry
        if read_id is None:
            continue
        entry = read_id
        if done.type is OpType.OK:
            if sealed is not None and entry > sealed:
                report("read-past-seal", entry, f"read above the seal {sealed}", done.index)
            bound = invoke.extra.get("lac", done.extra.get("lac"))
            if bound is not None and entry > int(bound):
                report(
                    "read-past-lac",
                    entry,
                    f"read above the LAC {bound} it was bound by",
                    done.index,
                )
        elif done.type is OpType.FAIL and done.error == NO_SUCH_ENTRY:
            acked_add = ledger.acked.get(entry)
            if acked_add is not None and acked_add.index < invoke.index:
                report(
                    "no-such-entry-for-committed",
                    entry,
                    "definite negative for an entry acknowledged before the read began",
                    acked_add.index,
                    done.index,
                )
            elif (
                sealed is not None
                and entry <= sealed
                and first_seal_index is not None
                and first_seal_index < invoke.index
            ):
                report(
                    "no-such-entry-for-committed",
                    entry,
                    f"definite negative for an entry <= the seal {sealed}",
                    done.index,
                )
            elif invoke.extra.get("final") and sealed is not None and entry <= sealed:
                report(
                    "no-such-entry-for-committed",
                    entry,
                    f"final read denies an entry <= the seal {sealed}",
                    done.index,
                )
    if sealed is not None:
        for op in ledger.lac_reads:
            if int(op.value) > sealed:
                report("lac-past-seal", None, f"LAC {op.value} above the seal {sealed}", op.index)

    # G4: nothing invoked after a seal was observed may be acknowledged.
    if first_seal_index is not None:
        for value, done in ledger.add_outcome.items():
            invoke = ledger.invoked_values[value]
            if done.type is OpType.OK and invoke.index > first_seal_index:
                report(
                    "add-acked-after-seal",
                    done.entry,
                    "add invoked after the seal was observed was acknowledged",
                    invoke.index,
                    done.index,
                )

    recovered = 0
    for value, done in ledger.add_outcome.items():
        if done.type is not OpType.OK and value in value_entry:
            recovered += 1
    return recovered


def _check_writer_order(
    process: str, ledger_id: int, adds: list[tuple[Op, Op]], violations: list[Violation]
) -> None:
    """Acks complete in entry order, and entry ids follow invocation order (one writer)."""
    last: Op | None = None
    for _invoke, done in adds:  # In completion order.
        assert done.entry is not None
        if last is not None and last.entry is not None and done.entry < last.entry:
            violations.append(
                Violation(
                    "ack-out-of-order",
                    ledger_id,
                    done.entry,
                    f"{process}: ack of {done.entry} after ack of {last.entry}",
                    (last.index, done.index),
                )
            )
        last = done
    by_invocation = sorted(adds, key=lambda pair: pair[0].index)
    previous: tuple[Op, Op] | None = None
    for pair in by_invocation:
        if previous is not None:
            before, after = previous[1].entry, pair[1].entry
            assert before is not None and after is not None
            if after <= before:
                violations.append(
                    Violation(
                        "entry-order",
                        ledger_id,
                        after,
                        f"{process}: invoked later but got id {after} <= {before}",
                        (previous[0].index, pair[0].index),
                    )
                )
        previous = pair
