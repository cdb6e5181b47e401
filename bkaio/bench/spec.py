"""The workload spec of `bkaio bench`: benchmarks/workloads.toml parsed into frozen dataclasses.

Pure: reads a TOML text, validates every key, and resolves a suite (its workloads, repeats and
time scaling) into the list of `Workload`s to run. Imports nothing from the service.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bkaio.errors import BKError

Shape = Literal["serial", "closed", "open"]
SHAPES: tuple[Shape, ...] = ("serial", "closed", "open")
MAX_PAYLOAD_BYTES = 1024 * 1024  # Far above the variants; more is a typo, not a workload.
MAX_DURATION_SECONDS = 600.0  # One run past 10 minutes would break the 15-minute budget alone.

_WORKLOAD_KEYS = frozenset(
    {
        "shape",
        "appends",
        "outstanding",
        "rate_per_second",
        "duration_seconds",
        "payload_bytes",
        "ensemble",
        "write_quorum",
        "ack_quorum",
        "warmup_seconds",
        "peer",
    }
)
_SUITE_KEYS = frozenset({"workloads", "repeats", "time_scale", "warmup_seconds"})


class BenchSpecError(BKError):
    """The workload spec file is malformed or names something that does not exist."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """One benchmark shape with its parameters; `label` is the name in the spec file."""

    label: str
    shape: Shape
    payload_bytes: int = 1024
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    warmup_seconds: float = 2.0
    appends: int = 0  # serial only
    outstanding: int = 1  # closed only
    rate_per_second: float = 0.0  # open only
    duration_seconds: float = 0.0  # closed and open
    peer: bool = True  # Whether the peer system runs it too.

    def __post_init__(self) -> None:
        where = f"workload {self.label!r}"
        if self.shape not in SHAPES:
            raise BenchSpecError(f"{where}: shape={self.shape!r} must be one of {SHAPES}")
        if not 0 < self.payload_bytes <= MAX_PAYLOAD_BYTES:
            raise BenchSpecError(
                f"{where}: payload_bytes={self.payload_bytes} must be in (0, {MAX_PAYLOAD_BYTES}]"
            )
        if not 0 < self.ack_quorum <= self.write_quorum <= self.ensemble:
            raise BenchSpecError(
                f"{where}: quorums must satisfy 0 < ack_quorum ({self.ack_quorum}) <= "
                f"write_quorum ({self.write_quorum}) <= ensemble ({self.ensemble})"
            )
        if self.warmup_seconds < 0:
            raise BenchSpecError(f"{where}: warmup_seconds={self.warmup_seconds} must be >= 0")
        if self.shape == "serial" and self.appends <= 0:
            raise BenchSpecError(f"{where}: a serial workload needs appends > 0")
        if self.shape != "serial" and not 0 < self.duration_seconds <= MAX_DURATION_SECONDS:
            raise BenchSpecError(
                f"{where}: duration_seconds={self.duration_seconds} must be in "
                f"(0, {MAX_DURATION_SECONDS}]"
            )
        if self.shape == "closed" and self.outstanding <= 0:
            raise BenchSpecError(f"{where}: outstanding={self.outstanding} must be > 0")
        if self.shape == "open" and self.rate_per_second <= 0:
            raise BenchSpecError(f"{where}: rate_per_second={self.rate_per_second} must be > 0")

    @property
    def quorum(self) -> str:
        return f"E{self.ensemble}/Qw{self.write_quorum}/Qa{self.ack_quorum}"

    def describe(self) -> str:
        """A short human description, e.g. `open 5000/s 20s 1024B E3/Qw3/Qa2`."""
        if self.shape == "serial":
            what = f"serial {self.appends} appends"
        elif self.shape == "closed":
            what = f"closed {self.outstanding} outstanding {self.duration_seconds:g}s"
        else:
            what = f"open {self.rate_per_second:g}/s {self.duration_seconds:g}s"
        return f"{what} {self.payload_bytes}B {self.quorum}"

    def scaled(self, time_scale: float, warmup_seconds: float | None) -> Workload:
        """The same workload shortened by `time_scale` (quick mode); never below 1 append/run."""
        return replace(
            self,
            appends=max(1, round(self.appends * time_scale)) if self.appends else 0,
            duration_seconds=self.duration_seconds * time_scale,
            warmup_seconds=self.warmup_seconds if warmup_seconds is None else warmup_seconds,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Suite:
    name: str
    workloads: tuple[Workload, ...]
    repeats: int


def _typed(where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    # bool is an int in Python; a `true` where a number belongs is still a typo.
    if isinstance(value, bool) and kind is not bool:
        raise BenchSpecError(f"{where}: {key}={value!r} must be {kind}, not a boolean")
    if not isinstance(value, kind):
        raise BenchSpecError(f"{where}: {key}={value!r} has the wrong type")
    return value


def _workload(label: str, table: dict[str, Any], defaults: dict[str, Any]) -> Workload:
    where = f"workload {label!r}"
    if not isinstance(table, dict):
        raise BenchSpecError(f"{where} must be a table")
    unknown = (set(table) | set(defaults)) - _WORKLOAD_KEYS
    if unknown:
        raise BenchSpecError(f"{where}: unknown key(s) {sorted(unknown)}")
    merged = {**defaults, **table}
    if "shape" not in merged:
        raise BenchSpecError(f"{where}: `shape` is missing (one of {SHAPES})")
    kinds: dict[str, type | tuple[type, ...]] = {
        "shape": str,
        "peer": bool,
        "appends": int,
        "outstanding": int,
        "payload_bytes": int,
        "ensemble": int,
        "write_quorum": int,
        "ack_quorum": int,
        "rate_per_second": (int, float),
        "duration_seconds": (int, float),
        "warmup_seconds": (int, float),
    }
    fields = {key: _typed(where, key, value, kinds[key]) for key, value in merged.items()}
    for key in ("rate_per_second", "duration_seconds", "warmup_seconds"):
        if key in fields:
            fields[key] = float(fields[key])
    return Workload(label=label, **fields)


def parse_spec(text: str, *, source: str = "<spec>") -> dict[str, Any]:
    """The raw TOML document, with a `BenchSpecError` naming `source` when it does not parse."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise BenchSpecError(f"{source}: not valid TOML: {error}") from None
    unknown = set(document) - {"defaults", "workloads", "suites"}
    if unknown:
        raise BenchSpecError(f"{source}: unknown top-level table(s) {sorted(unknown)}")
    return document


def load_suite(text: str, suite_name: str, *, source: str = "<spec>") -> Suite:
    """Resolve suite `suite_name` of the spec `text` into the workloads to run."""
    document = parse_spec(text, source=source)
    defaults = document.get("defaults", {})
    tables = document.get("workloads", {})
    suites = document.get("suites", {})
    if suite_name not in suites:
        raise BenchSpecError(
            f"{source}: no suite {suite_name!r}; the spec defines {sorted(suites) or 'none'}"
        )
    suite = suites[suite_name]
    where = f"{source}: suite {suite_name!r}"
    unknown = set(suite) - _SUITE_KEYS
    if unknown:
        raise BenchSpecError(f"{where}: unknown key(s) {sorted(unknown)}")
    labels = suite.get("workloads", [])
    if not isinstance(labels, list) or not labels:
        raise BenchSpecError(f"{where}: `workloads` must be a non-empty list of workload names")
    missing = [label for label in labels if label not in tables]
    if missing:
        raise BenchSpecError(f"{where}: names undefined workload(s) {missing}")
    repeats = _typed(where, "repeats", suite.get("repeats", 3), int)
    if not 1 <= repeats <= 100:
        raise BenchSpecError(f"{where}: repeats={repeats} must be in [1, 100]")
    time_scale = float(_typed(where, "time_scale", suite.get("time_scale", 1.0), (int, float)))
    if not 0 < time_scale <= 10:
        raise BenchSpecError(f"{where}: time_scale={time_scale} must be in (0, 10]")
    warmup = suite.get("warmup_seconds")
    if warmup is not None:
        warmup = float(_typed(where, "warmup_seconds", warmup, (int, float)))
    workloads = tuple(
        _workload(label, tables[label], defaults).scaled(time_scale, warmup) for label in labels
    )
    return Suite(name=suite_name, workloads=workloads, repeats=repeats)


def default_spec_path() -> Path:
    """benchmarks/workloads.toml of the working directory, else of this source checkout."""
    here = Path("benchmarks/workloads.toml")
    if here.exists():
        return here
    return Path(__file__).resolve().parents[2] / "benchmarks" / "workloads.toml"


def read_suite(path: Path, suite_name: str) -> Suite:
    try:
        text = path.read_text()
    except OSError as error:
        raise BenchSpecError(f"cannot read workload spec {path}: {error.strerror}") from None
    return load_suite(text, suite_name, source=str(path))
