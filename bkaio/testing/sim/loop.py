"""A virtual-time asyncio event loop with a seeded scheduler (deterministic simulation).

`SimLoop` is an `asyncio.BaseEventLoop` without a selector:

- **Virtual time.** `time()` is a number the loop moves. Running a callback costs
  `callback_seconds`; when nothing is ready the clock jumps to the next timer. Nothing is ready
  and no timer is set: every task waits for something that will never come, `SimDeadlockError`.
- **A seeded scheduler.** The callbacks that become ready from *outside* in one iteration (due
  timers: network deliveries, simulated thread work, sleeps, timeouts) run in an order the
  seeded generator picks, and with `reorder_window` > 0 timers due within that window of each
  other are taken together and shuffled, as a loop that was busy for that long would find them
  all due at once. Callbacks that code schedules with `call_soon` keep asyncio's documented
  FIFO order (code relies on it: a future's callbacks run in the order they were added).
- **Processes.** A callback whose context belongs to a dead simulated process
  (bkaio.testing.sim.process) is dropped instead of run.
- **No real I/O.** There is no selector: sockets, pipes, signals, subprocesses and the default
  thread pool are refused (`SimViolation`); `run_in_executor(None, ...)` runs the function on a
  `SimPool`; `create_connection` goes to the attached in-memory network.

Same seed, same code, same interpreter state: the same schedule, to the callback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import heapq
import random
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, TypeVarTuple, cast

from bkaio.testing.sim.process import is_dead, owner_of
from bkaio.testing.sim.threads import SimPool

if TYPE_CHECKING:
    from bkaio.testing.sim.network import SimNetwork

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SimDeadlockError(RuntimeError):
    """Every task waits for something that no timer or callback will ever bring."""


class SimLivelockError(RuntimeError):
    """The simulation ran more callbacks than its budget allows (something spins)."""


class SimViolation(RuntimeError):
    """Code inside the simulation tried to use a real socket, thread, sleep, pipe or signal."""


class SimLoop(asyncio.BaseEventLoop):
    # BaseEventLoop's own state, which this loop drives (the type stubs do not list it).
    _scheduled: list[_SimTimer]
    _ready: deque[asyncio.Handle]
    _stopping: bool
    _thread_id: int | None
    _timer_cancelled_count: int
    _check_closed: Callable[[], None]

    def __init__(
        self,
        rng: random.Random,
        *,
        reorder_window: float = 0.0,
        callback_seconds: float = 1e-6,
        max_callbacks: int | None = None,
        executor_delay: tuple[float, float] = (1e-5, 2e-4),
    ) -> None:
        super().__init__()
        self._clock = 0.0
        self._rng = rng
        self.reorder_window = reorder_window
        self.callback_seconds = callback_seconds
        self.max_callbacks = max_callbacks
        self.callbacks_run = 0
        self.callbacks_dropped = 0
        self.network: SimNetwork | None = None
        self._sequence = 0  # Ties between timers due at the same instant: scheduling order.
        delay_rng = random.Random(rng.random())
        self.default_executor = SimPool(
            self, "default-executor", 8, lambda: delay_rng.uniform(*executor_delay)
        )
        self.errors: list[dict[str, Any]] = []  # What reached the exception handler.
        self.violations: list[str] = []  # Real I/O refused (even if the code caught it).
        self.set_exception_handler(self._record_error)

    # ----------------------------------------------------------------- time and scheduling

    def time(self) -> float:
        return self._clock

    def call_at(
        self,
        when: float,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        self._check_closed()
        self._sequence += 1
        timer = _SimTimer(when, self._sequence, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def call_soon_threadsafe(
        self,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if self._thread_id is not None and threading.get_ident() != self._thread_id:
            self.violations.append("a call from another thread")
            raise SimViolation("call_soon_threadsafe from another thread: threads are simulated")
        return self.call_soon(callback, *args, context=context)

    def _write_to_self(self) -> None:
        pass  # Nothing to wake: there is no selector.

    def _process_events(self, event_list: list[Any]) -> None:
        del event_list

    def _run_once(self) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False
        if not self._ready and not self._stopping:
            if not scheduled:
                raise SimDeadlockError("simulation deadlock: no timer and nothing ready")
            horizon = max(self._clock, scheduled[0]._when) + self.reorder_window
        else:
            horizon = self._clock
        due: list[_SimTimer] = []
        while scheduled and scheduled[0]._when <= horizon:
            timer = heapq.heappop(scheduled)
            timer._scheduled = False
            if timer._cancelled:
                self._timer_cancelled_count -= 1
                continue
            due.append(timer)
        if due:
            self._clock = max(self._clock, due[-1]._when)
            if len(due) > 1:
                self._rng.shuffle(due)
            self._ready.extend(due)
        ready = self._ready
        for _ in range(len(ready)):
            handle = cast(_Handle, ready.popleft())
            if handle._cancelled:
                continue
            if is_dead(handle._context):
                self.callbacks_dropped += 1
                continue
            self._clock += self.callback_seconds
            self.callbacks_run += 1
            handle._run()
        if self.max_callbacks is not None and self.callbacks_run > self.max_callbacks:
            raise SimLivelockError(
                f"more than {self.max_callbacks} callbacks at virtual time {self._clock:.3f}"
            )

    # ----------------------------------------------------------------- tasks and errors

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        task = super().create_task(coro, name=name, context=context)
        owner = owner_of(context)
        if owner is not None:
            owner.tasks.add(task)
        return task

    def _record_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        del loop
        self.errors.append(context)

    # ----------------------------------------------------------------- threads

    def run_in_executor(  # type: ignore[override]
        self, executor: concurrent.futures.Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        self._check_closed()
        if executor is None:
            executor = self.default_executor
        if not isinstance(executor, SimPool):
            self.violations.append("a real executor")
            raise SimViolation(f"run_in_executor on a real executor {executor!r}")
        return asyncio.wrap_future(executor.submit(func, *args), loop=self)

    def set_default_executor(self, executor: Any) -> None:
        self.violations.append("a real default executor")
        raise SimViolation("a real default executor in the simulation")

    # ----------------------------------------------------------------- the network

    async def create_connection(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        *,
        ssl: Any = None,
        **kwargs: Any,
    ) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        if self.network is None:
            self.violations.append("a connection outside the simulated network")
            raise SimViolation("create_connection without a simulated network")
        assert host is not None and port is not None, (host, port)
        if ssl is not None:  # Every simulated server speaks plain TCP: a handshake fails.
            await self.network.handshake_with_plain_server(host, port)
        return await self.network.connect(protocol_factory, host, port)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        self.violations.append("real I/O on the loop")
        raise SimViolation("real I/O (sockets, pipes, signals, subprocesses) in the simulation")

    create_server = _refuse
    create_unix_connection = _refuse
    create_unix_server = _refuse
    create_datagram_endpoint = _refuse
    connect_read_pipe = _refuse
    connect_write_pipe = _refuse
    subprocess_exec = _refuse
    subprocess_shell = _refuse
    add_reader = _refuse  # type: ignore[assignment]
    add_writer = _refuse  # type: ignore[assignment]
    add_signal_handler = _refuse  # type: ignore[assignment]
    getaddrinfo = _refuse
    getnameinfo = _refuse
    sock_connect = _refuse
    sock_accept = _refuse
    sock_recv = _refuse
    sock_sendall = _refuse


class _Handle(Protocol):
    """The parts of `asyncio.Handle` the loop uses (the type stubs do not list them)."""

    _cancelled: bool
    _context: contextvars.Context

    def _run(self) -> None: ...


class _SimTimer(asyncio.TimerHandle):
    """A timer ordered by (when, scheduling order): ties never depend on the heap's history."""

    __slots__ = ("_sequence",)
    _when: float
    _scheduled: bool
    _cancelled: bool

    def __init__(
        self,
        when: float,
        sequence: int,
        callback: Callable[..., object],
        args: Sequence[Any],
        loop: asyncio.AbstractEventLoop,
        context: contextvars.Context | None,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._sequence = sequence

    def __lt__(self, other: _SimTimer) -> bool:  # type: ignore[override]
        when, other_when = self._when, other._when
        return when < other_when or (when == other_when and self._sequence < other._sequence)

    def __gt__(self, other: _SimTimer) -> bool:  # type: ignore[override]
        return other.__lt__(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)
