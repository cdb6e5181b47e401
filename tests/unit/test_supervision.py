"""The supervisor and the backoff schedule (bkaio/supervision.py, bkaio/backoff.py)."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from bkaio.backoff import Backoff, RetriesExhaustedError, retry
from bkaio.supervision import (
    Degrade,
    Fatal,
    Once,
    Restart,
    Supervisor,
    TaskState,
    bounded,
    loop_supervisor,
    unless_stopped,
)
from tests.fixtures.loop_errors import LoopErrors

FAST = Restart(initial_delay_seconds=0.001, max_delay_seconds=0.002)


def failures(registry: CollectorRegistry, task: str) -> float:
    value = registry.get_sample_value("bkaio_task_failures_total", {"task": task})
    return 0.0 if value is None else value


# --- backoff -------------------------------------------------------------------------------------


def test_backoff_grows_to_its_cap_with_jitter_below_each_step() -> None:
    backoff = Backoff(0.1, 1.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    steps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    for delay, step in zip(delays, steps, strict=True):
        assert step / 2 <= delay <= step
    assert len(set(delays)) == len(delays)  # Jittered: no two equal.
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_backoff_survives_a_very_long_outage() -> None:
    backoff = Backoff(0.1, 5.0, jitter=0.0)
    for _ in range(5000):
        delay = backoff.next_delay()
    assert delay == 5.0


@pytest.mark.parametrize(
    ("initial", "maximum", "multiplier", "jitter"),
    [(0, 1, 2, 0.5), (2, 1, 2, 0.5), (0.1, 1, 0.5, 0.5), (0.1, 1, 2, 1.5)],
)
def test_backoff_refuses_bad_parameters(
    initial: float, maximum: float, multiplier: float, jitter: float
) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum, multiplier, jitter)


async def test_retry_returns_after_transient_errors() -> None:
    calls = 0
    waited: list[float] = []

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("not yet")
        return "ok"

    async def sleep(delay: float) -> None:
        waited.append(delay)

    result = await retry(
        flaky, backoff=Backoff(0.01, 0.1), retry_on=(ConnectionError,), attempts=5, sleep=sleep
    )
    assert result == "ok"
    assert calls == 3
    assert len(waited) == 2


async def test_retry_gives_up_after_its_attempts_and_keeps_the_cause() -> None:
    async def down() -> None:
        raise ConnectionError("refused")

    async def sleep(delay: float) -> None:
        del delay

    with pytest.raises(RetriesExhaustedError) as caught:
        await retry(
            down, backoff=Backoff(0.01, 0.1), retry_on=(ConnectionError,), attempts=3, sleep=sleep
        )
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert "3 attempts" in str(caught.value)


async def test_retry_gives_up_at_its_deadline() -> None:
    now = 0.0

    def clock() -> float:
        return now

    async def sleep(delay: float) -> None:
        nonlocal now
        now += delay

    async def down() -> None:
        raise TimeoutError

    with pytest.raises(RetriesExhaustedError):
        await retry(
            down,
            backoff=Backoff(0.5, 1.0),
            retry_on=(TimeoutError,),
            deadline_seconds=3.0,
            sleep=sleep,
            clock=clock,
        )
    assert now <= 3.0


async def test_retry_passes_other_errors_through_and_needs_a_bound() -> None:
    async def broken() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await retry(broken, backoff=Backoff(0.01, 0.1), retry_on=(OSError,), attempts=3)
    with pytest.raises(ValueError, match="unbounded"):
        await retry(broken, backoff=Backoff(0.01, 0.1), retry_on=(OSError,))


# --- supervisor ----------------------------------------------------------------------------------


async def test_a_failing_loop_is_logged_counted_and_restarted() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("test", registry=registry)
    runs = 0
    done = asyncio.Event()

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise OSError(5, "Input/output error")
        done.set()
        await asyncio.Event().wait()

    with capture_logs() as logs:
        supervisor.spawn("flush", loop, FAST)
        await asyncio.wait_for(done.wait(), 5)
    await supervisor.stop()
    assert runs == 3
    assert failures(registry, "flush") == 2
    failed = [e for e in logs if e["event"] == "task_failed"]
    assert len(failed) == 2
    assert all(e["log_level"] == "error" and e["task"] == "flush" for e in failed)
    assert failed[0]["exc_info"].__class__ is OSError
    assert not supervisor.fatal.done()
    (status,) = supervisor.statuses()
    assert status.failures == 2 and status.state is TaskState.STOPPED


async def test_every_task_is_exported_at_zero_from_the_start() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("test", registry=registry)
    supervisor.spawn("idle", asyncio.Event().wait, FAST)
    assert registry.get_sample_value("bkaio_task_failures_total", {"task": "idle"}) == 0.0
    await supervisor.stop()


async def test_degrade_enters_the_safe_state_before_restarting() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())
    seen: list[str] = []
    restarted = asyncio.Event()

    async def loop() -> None:
        if seen:
            restarted.set()
            await asyncio.Event().wait()
        raise OSError(28, "No space left on device")

    supervisor.spawn(
        "flush",
        loop,
        Degrade(lambda error: seen.append(str(error)), initial_delay_seconds=0.001),
    )
    await asyncio.wait_for(restarted.wait(), 5)
    await supervisor.stop()
    assert seen == ["[Errno 28] No space left on device"]


async def test_a_fatal_failure_resolves_fatal_once() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())

    async def journal() -> None:
        raise OSError(5, "fsync failed")

    supervisor.spawn("journal", journal, Fatal())
    failure = await asyncio.wait_for(supervisor.fatal, 5)
    assert failure.task == "journal"
    assert "fsync failed" in str(failure)
    assert not supervisor.healthy
    await supervisor.stop()


async def test_too_many_consecutive_failures_escalate() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())

    async def always() -> None:
        raise RuntimeError("broken for good")

    supervisor.spawn(
        "gc",
        always,
        Restart(initial_delay_seconds=0.001, max_delay_seconds=0.001, max_consecutive_failures=3),
    )
    failure = await asyncio.wait_for(supervisor.fatal, 5)
    assert failure.task == "gc"
    (status,) = supervisor.statuses()
    assert status.failures == 3 and status.state is TaskState.FAILED
    await supervisor.stop()


async def test_a_broken_safe_state_is_fatal() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())

    def cannot(error: BaseException) -> None:
        raise RuntimeError("cannot turn read-only")

    async def loop() -> None:
        raise OSError(30, "Read-only file system")

    supervisor.spawn("flush", loop, Degrade(cannot))
    failure = await asyncio.wait_for(supervisor.fatal, 5)
    assert "cannot turn read-only" in str(failure)
    await supervisor.stop()


async def test_a_normal_return_is_not_restarted() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    with capture_logs() as logs:
        supervisor.spawn("once", once, FAST)
        await asyncio.sleep(0.05)
    assert runs == 1
    assert not [e for e in logs if e["event"] == "task_failed"]
    (status,) = supervisor.statuses()
    assert status.state is TaskState.FINISHED
    await supervisor.stop()


async def test_names_are_unique_and_spawn_after_stop_is_refused() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())
    supervisor.spawn("a", asyncio.Event().wait, FAST)
    with pytest.raises(ValueError, match="already running"):
        supervisor.spawn("a", asyncio.Event().wait, FAST)
    await supervisor.stop()
    with pytest.raises(RuntimeError, match="after stop"):
        supervisor.spawn("b", asyncio.Event().wait, FAST)


async def test_the_loop_handler_logs_and_counts(loop_errors: LoopErrors) -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("test", registry=registry)
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    supervisor.install_loop_exception_handler()
    try:

        def bad_callback() -> None:
            raise ValueError("callback bug")

        with capture_logs() as logs:
            loop.call_soon(bad_callback)
            await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    assert failures(registry, "event_loop") == 1
    (event,) = [e for e in logs if e["event"] == "event_loop_exception"]
    assert event["log_level"] == "error"
    assert "callback bug" in event["error"]
    # The handler that was there before (this suite's, which fails a test) saw it too.
    (report,) = loop_errors.take()
    assert isinstance(report["exception"], ValueError)


async def test_stop_gives_up_on_a_task_that_ignores_cancellation() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    supervisor.spawn("stubborn", stubborn, FAST)
    await asyncio.sleep(0)
    with capture_logs() as logs:
        await supervisor.stop(timeout_seconds=0.05)
    assert [e["event"] for e in logs] == ["task_did_not_stop"]
    release.set()
    await asyncio.sleep(0.01)


async def test_once_hands_the_failure_on_and_does_not_restart() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("test", registry=registry)
    handed: list[BaseException] = []
    runs = 0

    async def roll() -> None:
        nonlocal runs
        runs += 1
        raise KeyError("bug in a roll")

    with capture_logs() as logs:
        task = supervisor.spawn("stream_roll", roll, Once(handed.append), instance="ns/s")
        await task  # The supervisor's task ends quietly: the failure was handled.
    assert runs == 1
    assert [type(error) for error in handed] == [KeyError]
    assert failures(registry, "stream_roll") == 1  # Counted under the kind, not the instance.
    (event,) = [e for e in logs if e["event"] == "task_failed"]
    assert event["task"] == "stream_roll[ns/s]" and event["log_level"] == "error"
    assert supervisor.healthy
    await asyncio.sleep(0)
    assert supervisor.statuses() == []  # An instance's entry goes when it ends.
    await supervisor.stop()


async def test_instances_of_one_kind_run_side_by_side() -> None:
    supervisor = Supervisor("test", registry=CollectorRegistry())
    release = asyncio.Event()
    first = supervisor.spawn("lease_keep_alive", release.wait, FAST, instance="7")
    again = supervisor.spawn("lease_keep_alive", release.wait, FAST, instance="7")
    other = supervisor.spawn("lease_keep_alive", release.wait, FAST, instance="8")
    assert len({s.name for s in supervisor.statuses()}) == 3
    first.cancel()
    release.set()
    await asyncio.gather(first, again, other, return_exceptions=True)
    await supervisor.stop()


async def test_library_tasks_run_on_the_adopted_supervisor_until_it_stops() -> None:
    registry = CollectorRegistry()
    service = Supervisor("bookie", registry=registry)
    default = loop_supervisor()
    assert default is loop_supervisor() and default is not service
    service.adopt_loop()
    assert loop_supervisor() is service
    await service.stop()
    assert loop_supervisor() is not service  # Stopped: later library tasks go elsewhere.


async def test_a_start_step_gives_way_to_stop() -> None:
    stop = asyncio.Event()
    cleaned = asyncio.Event()

    async def unreachable() -> None:
        try:
            await asyncio.sleep(30)  # Metadata retried while etcd is down.
        finally:
            cleaned.set()

    step = asyncio.ensure_future(unreachable())
    asyncio.get_running_loop().call_later(0.01, stop.set)
    assert not await unless_stopped(step, stop)
    assert step.cancelled() and cleaned.is_set()
    done = asyncio.ensure_future(asyncio.sleep(0, result=1))
    assert await unless_stopped(done, asyncio.Event())


async def test_a_stop_step_is_bounded() -> None:
    with capture_logs() as logs:
        assert not await bounded(asyncio.sleep(30), "deregister", seconds=0.01)
    assert [e["event"] for e in logs] == ["stop_step_timed_out"]
    assert await bounded(asyncio.sleep(0), "deregister", seconds=1)


async def test_a_failure_handled_where_it_happened_is_still_reported() -> None:
    registry = CollectorRegistry()
    supervisor = Supervisor("client", registry=registry)
    with capture_logs() as logs:
        supervisor.report("writable_callback", ValueError("one ledger's callback"))
    (event,) = logs
    assert event["event"] == "task_failed" and event["log_level"] == "error"
    assert failures(registry, "writable_callback") == 1
    assert supervisor.healthy
    await supervisor.stop()
