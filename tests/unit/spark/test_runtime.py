"""The connector's loop thread (bkaio/spark/runtime.py): failures on it are reported, a dead
loop fails calls instead of hanging them, and clean-up failures are logged, not hidden.

These tests drive `Runtime` from the test's own thread, as Spark's Python workers do; a call
that could hang runs on a daemon thread the test gives up on after `GUARD_SECONDS`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta import initialise_cluster_at
from bkaio.spark.runtime import LoopStoppedError, Runtime

GUARD_SECONDS = 30.0  # Far longer than the loop's liveness check (1 s): only a hang gets here.


def failures(task: str) -> float:
    value = REGISTRY.get_sample_value("bkaio_task_failures_total", {"task": task})
    return 0.0 if value is None else value


def guarded(call: Any, *args: Any) -> tuple[threading.Thread, list[BaseException | object]]:
    """Start `call(*args)` on a daemon thread; its outcome (result or exception) lands in the
    list. A daemon: when the call hangs, the test fails and the thread is left behind."""
    outcome: list[BaseException | object] = []

    def target() -> None:
        try:
            outcome.append(call(*args))
        except BaseException as error:  # Handed to the test.
            outcome.append(error)

    thread = threading.Thread(target=target, name="test-guarded-call", daemon=True)
    thread.start()
    return thread, outcome


def outcome_of(thread: threading.Thread, outcome: list[BaseException | object]) -> object:
    thread.join(GUARD_SECONDS)
    assert not thread.is_alive(), "the call hung"
    return outcome[0]


def kill_loop(gate: threading.Event | None = None) -> Any:
    """A callback that ends the loop's thread (as a SystemExit from a callback would), once
    `gate` is set."""

    def die() -> NoReturn:
        if gate is not None:
            gate.wait(GUARD_SECONDS)
        raise SystemExit("killed by the test")

    return die


def test_an_exception_reaching_the_loops_handler_is_logged_and_counted(runtime: Runtime) -> None:
    before = failures("event_loop")

    def bad_callback() -> None:
        raise ValueError("callback bug")

    with capture_logs() as logs:
        runtime.loop.call_soon_threadsafe(bad_callback)
        runtime.run(asyncio.sleep(0))  # Queued after the callback: it has run by now.
    assert failures("event_loop") == before + 1
    (event,) = [e for e in logs if e["event"] == "event_loop_exception"]
    assert event["log_level"] == "error"
    assert "callback bug" in event["error"]


def test_a_call_on_a_loop_whose_thread_died_fails_clearly() -> None:
    runtime = Runtime()
    before = failures("spark_loop")
    with capture_logs() as logs:
        runtime.loop.call_soon_threadsafe(kill_loop())
        runtime._thread.join(GUARD_SECONDS)
    assert failures("spark_loop") == before + 1
    (event,) = [e for e in logs if e["event"] == "spark_loop_died"]
    assert event["log_level"] == "error"
    assert "SystemExit" in event["error"]
    # Before the fix: queued on a loop nobody runs, and waited for for ever.
    error = outcome_of(*guarded(runtime.run, asyncio.sleep(0)))
    assert isinstance(error, LoopStoppedError)
    assert "bkaio-spark-loop" in str(error) and "died of SystemExit" in str(error)
    assert isinstance(error.__cause__, SystemExit)
    with capture_logs() as logs:
        runtime.close()
    assert runtime.loop.is_closed()
    assert [e["log_level"] for e in logs if e["event"] == "spark_runtime_close_skipped"] == [
        "warning"
    ]


def test_a_call_waiting_when_the_loop_dies_fails_clearly() -> None:
    runtime = Runtime()
    started = threading.Event()

    async def waits_for_ever() -> None:
        started.set()
        await asyncio.Event().wait()

    thread, outcome = guarded(runtime.run, waits_for_ever())
    assert started.wait(GUARD_SECONDS)  # `run()` is past its first look: it is waiting.
    runtime.loop.call_soon_threadsafe(kill_loop())
    error = outcome_of(thread, outcome)
    assert isinstance(error, LoopStoppedError), error
    assert "died of SystemExit" in str(error)
    # The test's own clean-up: the waiting task is cancelled (the loop is free to run here), so
    # it is not reported as destroyed while pending when it is collected.
    left = asyncio.all_tasks(runtime.loop)
    for task in left:
        task.cancel()
    runtime.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    runtime.close()


def test_a_read_whose_clean_up_fails_logs_a_warning(runtime: Runtime) -> None:
    async def rows() -> AsyncGenerator[int, None]:
        try:
            yield 1
            yield 2
        finally:
            raise RuntimeError("clean-up failed")

    with capture_logs() as logs:
        for row in runtime.iterate(rows()):
            assert row == 1
            break  # A `limit()`: the generator is closed on the loop, and its finally raises.
    (event,) = [e for e in logs if e["event"] == "spark_read_close_failed"]
    assert event["log_level"] == "warning"
    assert "clean-up failed" in event["error"]


def test_a_client_that_fails_to_close_is_logged_with_its_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    asyncio.run(initialise_cluster_at(uri))
    runtime = Runtime()
    runtime.run(runtime.lease(uri, {}))
    real_close = BookKeeper.close

    async def failing_close(self: BookKeeper) -> None:
        await real_close(self)
        raise RuntimeError("close failed")

    monkeypatch.setattr(BookKeeper, "close", failing_close)
    with capture_logs() as logs:
        runtime.close()
    (event,) = [e for e in logs if e["event"] == "spark_client_close_failed"]
    assert event["log_level"] == "warning"
    assert event["metadata"] == uri and "close failed" in event["error"]
    assert runtime.loop.is_closed()
