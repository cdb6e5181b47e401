"""One-shot supervised jobs (`bkaio.supervision.spawn_job`): an ensemble change and the like."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from bkaio.supervision import spawn_job


def _failures(registry: CollectorRegistry, kind: str) -> float:
    value = registry.get_sample_value("bkaio_task_failures_total", {"task": kind})
    return 0.0 if value is None else value


async def test_a_failing_job_is_logged_counted_by_kind_and_handed_to_its_owner() -> None:
    registry = CollectorRegistry()
    handed: list[BaseException] = []

    async def broken() -> None:
        raise KeyError("a bug")

    with capture_logs() as logs:
        task = spawn_job(
            "ledger-7-ensemble-change",
            broken,
            kind="ensemble_change",
            on_failure=handed.append,
            registry=registry,
        )
        await task
    assert task.done() and task.exception() is None  # Nothing reaches the loop's handler.
    assert [type(e) for e in handed] == [KeyError]
    assert _failures(registry, "ensemble_change") == 1
    (failed,) = [e for e in logs if e["event"] == "task_failed"]
    assert failed["log_level"] == "error" and failed["task"] == "ledger-7-ensemble-change"


async def test_a_job_that_ends_or_is_cancelled_is_not_a_failure() -> None:
    registry = CollectorRegistry()
    handed: list[BaseException] = []
    started: list[str] = []

    async def never_started() -> None:
        started.append("ran")

    early = spawn_job("early", never_started, kind="job", on_failure=handed.append)
    early.cancel()  # Before its first step: no coroutine is left un-awaited.
    await asyncio.gather(early, return_exceptions=True)
    assert early.cancelled() and started == []

    async def fine() -> int:
        return 1

    await spawn_job("ok", fine, kind="job", on_failure=handed.append, registry=registry)
    hanging = spawn_job(
        "hang", asyncio.Event().wait, kind="job", on_failure=handed.append, registry=registry
    )
    await asyncio.sleep(0)
    hanging.cancel()
    await asyncio.gather(hanging, return_exceptions=True)
    assert hanging.cancelled()
    assert handed == [] and _failures(registry, "job") == 0


async def test_a_broken_failure_hook_is_reported_too() -> None:
    registry = CollectorRegistry()

    async def broken() -> None:
        raise RuntimeError("first")

    def hook(error: BaseException) -> None:
        raise ValueError("the safe state failed")

    with capture_logs() as logs:
        await spawn_job("job-1", broken, kind="job", on_failure=hook, registry=registry)
    assert _failures(registry, "job") == 2
    assert [e["event"] for e in logs if e["log_level"] == "error"] == [
        "task_failed",
        "task_failure_hook_failed",
    ]
