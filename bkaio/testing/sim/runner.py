"""Run one seed of the simulation and judge it.

    outcome = run_in_child(1234)                   # the scenario the seed picks
    outcome = run_in_child(1234, scenario="f8", mutation="unfenced_recovery_reads")
    outcome.failed, outcome.report(), outcome.reproduce

A seed fixes everything: the scenario, the cluster, the workload, every fault and its moment,
every delay and the order of simultaneous events. One seed runs in a fresh `SimLoop` inside
`guards.sealed()`, in a directory of its own (on /dev/shm when there is one), in a process of
its own (forked: `run_in_child`, or a worker of bkaio.testing.sim.pool), which is thrown away
afterwards; then the history is checked.

Mutations (deliberately broken parts, bkaio.testing.mutations): `ack_before_fsync` (every
bookie's journal acknowledges before its fsync), `unfenced_recovery_reads` (every client's
recovery reads lose the FENCE flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import pickle
import random
import shutil
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import structlog

from bkaio.testing.checker import CheckResult, check
from bkaio.testing.mutations import UNFENCED_RECOVERY_READS, AckBeforeSync
from bkaio.testing.sim import guards
from bkaio.testing.sim.cluster import SimCluster
from bkaio.testing.sim.guards import sealed
from bkaio.testing.sim.loop import SimDeadlockError, SimLivelockError, SimLoop, SimViolation
from bkaio.testing.sim.scenarios import SCENARIOS, options_for, pick
from bkaio.testing.sim.threads import ProcessCrashed

R = TypeVar("R")
MUTATIONS = ("ack_before_fsync", "unfenced_recovery_reads")
_LENGTH = struct.Struct(">I")
MAX_CALLBACKS = 3_000_000  # Far more than any scenario needs: past it, something spins.
TOTAL_SECONDS = 600.0  # Virtual: a scenario and its final phase end well before.


@dataclass
class SimOutcome:
    seed: int
    scenario: str
    mutation: str | None
    description: str = ""
    result: CheckResult = field(default_factory=lambda: check([]))
    problem: str | None = None  # Liveness: the final phase did not finish, or the run broke.
    errors: list[str] = field(default_factory=list)  # What reached the loop's handler.
    notes: list[str] = field(default_factory=list)
    virtual_seconds: float = 0.0
    callbacks: int = 0
    wall_seconds: float = 0.0
    digest: str = ""  # Of the history: two runs of one seed must agree.
    history: str = ""  # JSON Lines, kept when the seed failed.
    chosen_scenario: bool = False  # Given by the caller (--scenario), not drawn from the seed.

    @property
    def failed(self) -> bool:
        return not self.result.valid or self.problem is not None or bool(self.errors)

    @property
    def reproduce(self) -> str:
        extra = f" SCENARIO={self.scenario}" if self.chosen_scenario else ""
        extra += f" MUTATION={self.mutation}" if self.mutation else ""
        return f"make sim SEED={self.seed}{extra}"

    def report(self, limit: int = 10) -> str:
        lines = [
            f"seed {self.seed} scenario {self.scenario}"
            + (f" mutation {self.mutation}" if self.mutation else "")
            + f": {self.description}",
            self.result.summary(limit),
        ]
        if self.problem:
            lines.append(f"problem: {self.problem}")
        lines += [f"loop error: {error}" for error in self.errors[:limit]]
        lines += [f"nemesis: {note}" for note in self.notes[-limit * 3 :]]
        lines.append(f"reproduce: {self.reproduce}")
        return "\n".join(lines)


@contextmanager
def _logs(level: int) -> Iterator[None]:
    """The real code's logs at `level` (CRITICAL: silent), stamped with the virtual time."""
    saved = structlog.get_config()

    def virtual_time(
        _logger: object, _name: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        with contextlib.suppress(RuntimeError):
            event["t"] = round(asyncio.get_running_loop().time(), 6)
        return event

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[virtual_time, structlog.dev.ConsoleRenderer(colors=False)],
        cache_logger_on_first_use=False,
    )
    logging.disable(level)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        structlog.configure(**saved)


def scratch_directory() -> Path:
    """A fresh directory for the simulated machines' files (on /dev/shm when there is one:
    their files are small and their syncs cost nothing there)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="bkaio-sim-", dir=shm if shm.is_dir() else None))


def run_seed(
    seed: int,
    *,
    root: Path,
    scenario: str | None = None,
    mutation: str | None = None,
    log_level: int = logging.CRITICAL,
) -> SimOutcome:
    """Run one seed in this process, in `root` (emptied first).

    The process is spent afterwards: the simulated processes' tasks are left suspended, never
    to run again (as their processes were killed), so that none of their code runs outside the
    simulation. Call this in a process of its own (`run_in_child`) and end that process with
    `os._exit`.
    """
    for entry in list(root.iterdir()) if root.exists() else []:
        shutil.rmtree(entry, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    name = scenario if scenario is not None else pick(rng)
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
    if mutation is not None and mutation not in MUTATIONS:
        raise ValueError(f"unknown mutation {mutation!r}; known: {', '.join(MUTATIONS)}")
    options = options_for(name, rng)
    if mutation == "ack_before_fsync":
        options.journal_ack = AckBeforeSync()
    elif mutation == "unfenced_recovery_reads":
        options.recovery_reads = UNFENCED_RECOVERY_READS
    outcome = SimOutcome(seed, name, mutation, chosen_scenario=scenario is not None)
    loop = SimLoop(
        random.Random(rng.random()),
        reorder_window=rng.choice([0.0, 0.0, 0.0005, 0.003]),
        max_callbacks=MAX_CALLBACKS,
    )
    holder: list[SimCluster] = []
    started = time.perf_counter()
    random.seed(rng.random())  # What production code draws from the global generator.

    async def main() -> None:
        cluster = SimCluster(random.Random(rng.random()), root, options)
        holder.append(cluster)
        async with asyncio.timeout(TOTAL_SECONDS):
            await cluster.start()
            outcome.description = await SCENARIOS[name](cluster, random.Random(rng.random()))
            cluster.stop_clients()  # The applications end: nothing they invoked completes later.
            cluster.history.close_open("simulation-phase-ended")
            outcome.problem = await cluster.finish()

    with _logs(log_level), sealed():
        try:
            loop.run_until_complete(main())
        except (SimDeadlockError, SimLivelockError, SimViolation, TimeoutError) as error:
            outcome.problem = f"{type(error).__name__}: {error}"
        finally:
            if holder:
                holder[0].stop_everything()
    outcome.wall_seconds = time.perf_counter() - started
    outcome.virtual_seconds = loop.time()
    outcome.callbacks = loop.callbacks_run
    outcome.errors = [_describe(error) for error in loop.errors if not _ignorable(error)]
    outcome.errors += [f"refused: {what}" for what in (*loop.violations, *guards.violations)]
    if holder:
        cluster = holder[0]
        outcome.result = check(cluster.history.ops)
        outcome.notes = cluster.notes
        history = cluster.history.to_jsonl()
        outcome.digest = hashlib.sha256(history.encode()).hexdigest()[:16]
        if outcome.failed:
            outcome.history = history
    return outcome


def run_in_child(
    seed: int,
    *,
    scenario: str | None = None,
    mutation: str | None = None,
    root: Path | None = None,
    log_level: int = logging.CRITICAL,
) -> SimOutcome:
    """`run_seed` in a forked child process; the outcome comes back through a pipe. With a
    `log_level` below CRITICAL the real code's logs go to stdout (a replay's detail)."""
    directory = root if root is not None else scratch_directory()
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # The child.
        os.close(reader)
        child_main(writer, seed, scenario, mutation, directory, log_level)
    os.close(writer)
    try:
        outcome = receive_message(reader)
    finally:
        os.close(reader)
        _, status = os.waitpid(pid, 0)
        if root is None:
            shutil.rmtree(directory, ignore_errors=True)
    if outcome is None:
        return SimOutcome(seed, scenario or "?", mutation, problem=f"child died: {status}")
    assert isinstance(outcome, SimOutcome)
    return outcome


def child_main(
    fd: int,
    seed: int,
    scenario: str | None,
    mutation: str | None,
    root: Path,
    log_level: int = logging.CRITICAL,
) -> NoReturn:
    """In a forked child: run the seed, send the outcome to `fd`, exit at once (nothing of
    the simulated processes runs again: no collection, no finalizers)."""
    gc.disable()  # A child lives for one seed; collections would only cost time.
    try:
        outcome = run_seed(
            seed, root=root, scenario=scenario, mutation=mutation, log_level=log_level
        )
    except BaseException:
        outcome = SimOutcome(
            seed, scenario or "?", mutation, problem=f"runner crashed:\n{traceback.format_exc()}"
        )
    with contextlib.suppress(OSError):
        send_message(fd, outcome)
    for stream in (sys.stdout, sys.stderr):  # `os._exit` would drop what a replay printed.
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def run_isolated(function: Callable[..., R], *args: object) -> R:
    """`function(*args)` in a forked child; its result (or exception) comes back pickled.

    For tests of simulated crashes: a killed process's tasks stay suspended for ever, and only
    a process that is thrown away afterwards (`os._exit`) never runs their remains.
    """
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(reader)
        gc.disable()
        try:
            message: tuple[bool, object] = (True, function(*args))
        except BaseException as error:
            message = (False, RuntimeError(f"{error!r}\n{traceback.format_exc()}"))
        with contextlib.suppress(OSError):
            send_message(writer, message)
        os._exit(0)
    os.close(writer)
    try:
        received = receive_message(reader)
    finally:
        os.close(reader)
        os.waitpid(pid, 0)
    if received is None:
        raise RuntimeError("the isolated process died without an answer")
    ok, value = received
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return cast(R, value)


def send_message(fd: int, message: object) -> None:
    """A length-prefixed pickle on a pipe."""
    data = pickle.dumps(message)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def receive_message(fd: int) -> Any:
    """What `send_message` sent, or None at the end of the pipe."""
    head = _read_exactly(fd, _LENGTH.size)
    if head is None:
        return None
    (length,) = _LENGTH.unpack(head)
    body = _read_exactly(fd, length)
    return None if body is None else pickle.loads(body)


def _read_exactly(fd: int, count: int) -> bytes | None:
    parts: list[bytes] = []
    while count:
        chunk = os.read(fd, count)
        if not chunk:
            return None
        parts.append(chunk)
        count -= len(chunk)
    return b"".join(parts)


def _ignorable(context: dict[str, object]) -> bool:
    return isinstance(context.get("exception"), ProcessCrashed)


def _describe(context: dict[str, object]) -> str:
    error = context.get("exception")
    message = context.get("message", "")
    return f"{message}: {error!r}" if error is not None else str(message)
