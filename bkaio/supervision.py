"""Supervised long-lived tasks: nothing a service runs in the background ends silently.

Every long-lived task of a service (a bookie's flush loop, checkpointer, GC, disk checker and
registration keepalive; autorecovery's auditor and replication worker; a client's explicit-LAC
timer; a stream writer's roller) is started with `Supervisor.spawn(name, factory, policy)`.
When a run raises anything but a cancellation, the supervisor logs `task_failed` at ERROR with
the task's name and the traceback, counts it in `bkaio_task_failures_total{task}`, and acts on
the task's policy:

- `Restart`: an idempotent loop. The factory runs again after a jittered exponential backoff
  (bkaio/backoff.py); a run that lasted `healthy_after_seconds` resets the schedule. After
  `max_consecutive_failures` failures in a row it escalates as `Fatal`.
- `Degrade(on_failure)`: `on_failure(error)` puts the service into a safe state first (a bookie
  whose ledger storage cannot write turns read-only), then the task restarts like `Restart`.
  Coming back (writable again) is the restarted task's own decision, when its work succeeds.
- `Fatal`: nothing can make the service correct again from inside (a journal that cannot
  fsync). The supervisor resolves `fatal` once; the service's main coroutine waits on it beside
  its stop signal, shuts down and exits with `EXIT_TASK_FAILED`, so systemd restarts it.
- `Once(on_failure)`: a one-off background operation (a stream's roll, a connection attempt, an
  explicit-LAC write). Not restarted; `on_failure(error)` fails whatever waits on it.

One-shot jobs of a library object (a ledger handle's ensemble change or explicit-LAC write,
a stream writer's roll) are not services' tasks: there are many of them, each ends, and the
object that starts one tracks it. `spawn_job(name, factory, kind=..., on_failure=...)` runs one:
an unexpected exception is logged and counted the same way (under `task=kind`, so the metric's
labels stay few however many objects there are) and handed to `on_failure`, which puts the
object into a safe state (a failed handle). Nothing restarts. (A service's own one-offs, which
its `stop()` must cancel, are `spawn(..., Once(...))` instead.)

A run that returns normally is over: logged at DEBUG (`task_finished`), not restarted. The event
loop's exception handler (callbacks, done-callbacks and futures nobody awaited that raised) is
routed here too by `install_loop_exception_handler`: logged at ERROR and counted under the task
name `event_loop`.

Tasks of one kind that run many at a time (a lease's keep-alive, a ledger's ensemble change)
share a `name` (the metric label) and differ by `instance`; their status entry goes when they
end. Library code (client, metadata, streams) that runs inside a service spawns on
`loop_supervisor()`: the service's own supervisor once it `adopt_loop()`ed, else one per loop
that logs and counts the same way.

BookKeeper's equivalent is the bookie's "critical thread" handling plus its ledger directory
monitor; see docs/bookie.md ("Supervision").
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from bkaio.backoff import Backoff, jitter_source

log = structlog.get_logger(__name__)

EXIT_TASK_FAILED: Final = 3  # A fatal task failure: distinct from start failures (2).
EVENT_LOOP_TASK: Final = "event_loop"


@dataclass(frozen=True, slots=True)
class Restart:
    """Restart after a jittered exponential backoff; escalate to fatal after too many in a row."""

    initial_delay_seconds: float = 0.1
    max_delay_seconds: float = 30.0
    healthy_after_seconds: float = 60.0
    max_consecutive_failures: int | None = None  # None: keep restarting (with the backoff cap).


@dataclass(frozen=True, slots=True)
class Degrade:
    """Enter a safe state (`on_failure(error)`), then restart like `Restart`."""

    on_failure: Callable[[BaseException], None]
    initial_delay_seconds: float = 0.1
    max_delay_seconds: float = 30.0
    healthy_after_seconds: float = 60.0
    max_consecutive_failures: int | None = None


@dataclass(frozen=True, slots=True)
class Fatal:
    """The first failure ends the service (non-zero exit; the service manager restarts it)."""


@dataclass(frozen=True, slots=True)
class Once:
    """Run once; an unexpected exception is reported, then handed to `on_failure`."""

    on_failure: Callable[[BaseException], None] | None = None


Policy = Restart | Degrade | Fatal | Once


class TaskState(enum.Enum):
    RUNNING = "running"
    BACKING_OFF = "backing_off"  # Failed; waiting to run again.
    FINISHED = "finished"  # Returned normally.
    FAILED = "failed"  # Failed for good (fatal, or escalated).
    STOPPED = "stopped"  # Cancelled by `stop()`.


@dataclass(slots=True)
class TaskStatus:
    """What `/status` and `bookie info` show of one supervised task."""

    name: str
    policy: str
    state: TaskState
    failures: int = 0  # Failed runs in all.
    consecutive_failures: int = 0
    last_error: str | None = None
    last_failure_at: float | None = None  # time.time() of the last failure.

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "policy": self.policy,
            "state": self.state.value,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
            "last_failure_at": self.last_failure_at,
        }


@dataclass(frozen=True, slots=True)
class FatalTaskFailure:
    """Why a supervisor gave up: the task and its last error."""

    task: str
    error: BaseException

    def __str__(self) -> str:
        return f"task {self.task!r} failed fatally: {type(self.error).__name__}: {self.error}"


# One counter per registry: services record into their own registries (a shard worker ships
# its registry to the parent), and prometheus refuses a second counter of one name per registry.
_failure_counters: dict[int, tuple[CollectorRegistry, Counter]] = {}


def task_failures_counter(registry: CollectorRegistry = REGISTRY) -> Counter:
    """`bkaio_task_failures_total{task}` in `registry` (created on first use)."""
    entry = _failure_counters.get(id(registry))
    if entry is None or entry[0] is not registry:
        counter = Counter(
            "bkaio_task_failures_total",
            "Unexpected exceptions in supervised long-lived tasks, by task",
            ["task"],
            registry=registry,
        )
        entry = (registry, counter)
        _failure_counters[id(registry)] = entry
    return entry[1]


class Supervisor:
    """Runs and watches a service's long-lived tasks. Every method runs on the service's loop."""

    def __init__(
        self,
        service: str,
        *,
        registry: CollectorRegistry = REGISTRY,
        rng: random.Random | None = None,
    ) -> None:
        self.service = service
        self._log = log.bind(service=service)
        self._failures = task_failures_counter(registry)
        self._rng = rng if rng is not None else jitter_source()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._status: dict[str, TaskStatus] = {}
        self._stopping = False
        self._instance_seq = 0
        self._previous_handler: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
        self._previous_handler = None
        self.fatal: asyncio.Future[FatalTaskFailure] = asyncio.get_running_loop().create_future()

    # --- running ------------------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        factory: Callable[[], Awaitable[object]],
        policy: Policy,
        *,
        instance: str = "",
    ) -> asyncio.Task[None]:
        """Start `factory()` as the task `name` (one of many of that name: `instance`).

        A `name` without `instance` is unique among running tasks. Cancelling the returned
        task stops it (its owner may do that on close); `stop()` stops every task."""
        if self._stopping:
            raise RuntimeError(f"{self.service}: spawn({name!r}) after stop()")
        key = f"{name}[{instance}]" if instance else name
        running = self._tasks.get(key)
        if running is not None and not running.done():
            if not instance:
                raise ValueError(f"{self.service}: a task named {key!r} is already running")
            # One instance's next task, started from its last one (a roll after a roll).
            self._instance_seq += 1
            key = f"{key}#{self._instance_seq}"
        self._failures.labels(task=name)  # Exported at 0 from the start, not from the first fault.
        status = TaskStatus(key, type(policy).__name__.lower(), TaskState.RUNNING)
        self._status[key] = status
        task = asyncio.get_running_loop().create_task(
            self._supervise(status, name, factory, policy), name=f"{self.service}:{key}"
        )
        self._tasks[key] = task
        if instance:
            task.add_done_callback(lambda _task: self._forget(key, task))
        return task

    def _forget(self, key: str, task: asyncio.Task[None]) -> None:
        """An instance task ended: its entries go (kinds stay in the metric)."""
        if self._tasks.get(key) is task:
            del self._tasks[key]
            self._status.pop(key, None)

    async def _supervise(
        self,
        status: TaskStatus,
        name: str,
        factory: Callable[[], Awaitable[object]],
        policy: Policy,
    ) -> None:
        backoff = None
        if isinstance(policy, Restart | Degrade):
            backoff = Backoff(policy.initial_delay_seconds, policy.max_delay_seconds, rng=self._rng)
        while True:
            status.state = TaskState.RUNNING
            started = asyncio.get_running_loop().time()  # The loop's clock (virtual in the sim).
            try:
                await factory()
            except asyncio.CancelledError:
                status.state = TaskState.STOPPED
                raise
            except BaseException as error:  # Reported, then handled by policy.
                if isinstance(error, KeyboardInterrupt | SystemExit):
                    raise
                # A run that lasted long enough was healthy: start the schedule again.
                ran = asyncio.get_running_loop().time() - started
                if isinstance(policy, Restart | Degrade) and ran >= policy.healthy_after_seconds:
                    assert backoff is not None
                    backoff.reset()
                    status.consecutive_failures = 0
                self._record_failure(status, name, error)
                if isinstance(policy, Once):
                    status.state = TaskState.FAILED
                    self._call_hook(name, policy.on_failure, error)
                    return
                if isinstance(policy, Degrade):
                    self._call_hook(name, policy.on_failure, error)
                limit = None if isinstance(policy, Fatal) else policy.max_consecutive_failures
                if backoff is None or (limit is not None and status.consecutive_failures >= limit):
                    status.state = TaskState.FAILED
                    self._declare_fatal(name, error)
                    return
                delay = backoff.next_delay()
                status.state = TaskState.BACKING_OFF
                self._log.info("task_restarting", task=status.name, delay_seconds=round(delay, 3))
                await asyncio.sleep(delay)
                continue
            status.state = TaskState.FINISHED
            if not self._stopping:
                self._log.debug("task_finished", task=status.name)
            return

    def _record_failure(self, status: TaskStatus, name: str, error: BaseException) -> None:
        status.failures += 1
        status.consecutive_failures += 1
        status.last_error = f"{type(error).__name__}: {error}"
        status.last_failure_at = time.time()
        self._failures.labels(task=name).inc()
        self._log.error(
            "task_failed",
            task=status.name,
            policy=status.policy,
            failures=status.failures,
            error=status.last_error,
            exc_info=error,
        )

    def _call_hook(
        self, name: str, hook: Callable[[BaseException], None] | None, error: BaseException
    ) -> None:
        """A policy's `on_failure`: the safe state. One that cannot be reached is fatal."""
        if hook is None:
            return
        try:
            hook(error)
        except Exception as hook_error:  # Handed on: fatal for the service.
            self._log.error("task_degrade_failed", task=name, error=str(hook_error), exc_info=True)
            self._declare_fatal(name, hook_error)

    def _declare_fatal(self, name: str, error: BaseException) -> None:
        self._log.critical("task_fatal", task=name, error=f"{type(error).__name__}: {error}")
        if not self.fatal.done():
            self.fatal.set_result(FatalTaskFailure(name, error))

    def report(self, name: str, error: BaseException) -> None:
        """A failure caught where it happened (one callback of many raised; the others must
        still run) and handled there: logged and counted like a task's."""
        status = self._status.get(name) or TaskStatus(name, "report", TaskState.FINISHED)
        self._record_failure(status, name, error)

    def report_fatal(self, name: str, error: BaseException) -> None:
        """A failure found outside a supervised task (a callback, a thread) that ends the
        service: reported like a task's, then fatal."""
        status = self._status.setdefault(name, TaskStatus(name, "fatal", TaskState.FAILED))
        self._record_failure(status, name, error)
        status.state = TaskState.FAILED
        self._declare_fatal(name, error)

    def adopt_loop(self) -> None:
        """Make this the running loop's supervisor: what library code (metadata leases, client
        connections, streams) spawns on `loop_supervisor()` runs here, until `stop()`."""
        _loop_supervisors[asyncio.get_running_loop()] = self

    # --- the event loop's handler -------------------------------------------------------------

    def install_loop_exception_handler(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Route what reaches the loop's exception handler here: ERROR log, counted.

        A handler installed before (a test's, which fails the test) still sees every report."""
        target = loop if loop is not None else asyncio.get_running_loop()
        self._previous_handler = target.get_exception_handler()
        target.set_exception_handler(self._loop_exception)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        self._failures.labels(task=EVENT_LOOP_TASK).inc()
        self._log.error(
            "event_loop_exception",
            task=EVENT_LOOP_TASK,
            message=context.get("message"),
            error=None if error is None else f"{type(error).__name__}: {error}",
            exc_info=error,
        )
        if self._previous_handler is not None:
            self._previous_handler(loop, context)

    # --- looking and stopping -----------------------------------------------------------------

    def statuses(self) -> list[TaskStatus]:
        return list(self._status.values())

    def __iter__(self) -> Iterator[TaskStatus]:
        return iter(self._status.values())

    @property
    def healthy(self) -> bool:
        """No fatal failure (a task that failed once, under `Once`, was handled)."""
        return not self.fatal.done()

    async def stop(self, timeout_seconds: float = 5.0) -> None:
        """Cancel every task and wait for them, at most `timeout_seconds` (then log the rest)."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        if _loop_supervisors.get(loop) is self:
            del _loop_supervisors[loop]  # Library tasks spawned from now on go elsewhere.
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_seconds)
        for task in pending:
            self._log.error("task_did_not_stop", task=task.get_name(), timeout=timeout_seconds)


def spawn_job(
    name: str,
    job: Callable[[], Awaitable[object]],
    *,
    kind: str,
    on_failure: Callable[[BaseException], None],
    registry: CollectorRegistry = REGISTRY,
) -> asyncio.Task[None]:
    """Run `job()` once as the task `name` (see the module doc); the caller keeps the task.

    An exception other than a cancellation is logged at ERROR (`task_failed`, with `name`),
    counted in `bkaio_task_failures_total{task=kind}` and passed to `on_failure`; the task then
    ends normally, so nothing reaches the event loop's handler.
    """
    counter = task_failures_counter(registry)

    async def run() -> None:
        try:
            await job()  # Called here: a job cancelled before it starts leaves no coroutine.
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # Reported, then handed to the owner.
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise
            counter.labels(task=kind).inc()
            log.error(
                "task_failed",
                task=name,
                kind=kind,
                error=f"{type(error).__name__}: {error}",
                exc_info=error,
            )
            try:
                on_failure(error)
            except Exception as hook_error:  # The owner's safe state is broken: say so.
                counter.labels(task=kind).inc()
                log.error(
                    "task_failure_hook_failed", task=name, error=str(hook_error), exc_info=True
                )

    return asyncio.get_running_loop().create_task(run(), name=name)


_loop_supervisors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Supervisor] = (
    weakref.WeakKeyDictionary()
)


def loop_supervisor() -> Supervisor:
    """The running loop's supervisor: a service's (`adopt_loop`), else one made for the loop
    (service "process", the default registry), where library code runs its tasks."""
    loop = asyncio.get_running_loop()
    supervisor = _loop_supervisors.get(loop)
    if supervisor is None:
        supervisor = Supervisor("process")
        _loop_supervisors[loop] = supervisor
    return supervisor


# --- stopping when told ---------------------------------------------------------------------------

STOP_STEP_SECONDS: Final = 3.0  # How long a service's stop waits for one step on a dependency.


async def unless_stopped(
    future: asyncio.Future[Any], stop: asyncio.Event, *, cleanup_seconds: float = STOP_STEP_SECONDS
) -> bool:
    """Wait for `future` (its error is raised); False if `stop` is set first.

    A start-up step that waits on a dependency (metadata retried for 30 s while etcd is down)
    must give way to SIGTERM: the step is cancelled and given `cleanup_seconds` to clean up.
    """
    stop_wait = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([stop_wait, future], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
    if future.done():
        future.result()
        return True
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        async with asyncio.timeout(cleanup_seconds):
            await future  # Whatever it raises while cleaning up no longer matters: stopping.
    return False


async def bounded(step: Awaitable[object], name: str, seconds: float = STOP_STEP_SECONDS) -> bool:
    """Await a stop step (resign, deregister, close a connection) for at most `seconds`.

    False, with a warning, when it ran out: a dependency is unreachable, and what the step
    would have released (a lease) ends by itself.
    """
    try:
        async with asyncio.timeout(seconds):
            await step
    except TimeoutError:
        log.warning("stop_step_timed_out", step=name, seconds=seconds)
        return False
    return True
