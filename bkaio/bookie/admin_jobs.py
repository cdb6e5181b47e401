"""recover/decommission jobs started over admin HTTP: they outlive the request that started them.

job_id = jobs.start("recover", bookie_id, work)    # work(progress) -> RecoveryReport
jobs.jobs[job_id]    # {"id", "kind", "bookie_id", "state", "progress", "report", "error", ...}
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bkaio.errors import BKError
from bkaio.supervision import spawn_job


class AdminJobs:
    """Jobs by id; `cancel_all` at shutdown."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.jobs: dict[int, dict[str, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, kind: str, bookie_id: str, work: Callable[[Any], Awaitable[Any]]) -> int:
        job_id = next(self._ids)
        job: dict[str, Any] = {
            "id": job_id,
            "kind": kind,
            "bookie_id": bookie_id,
            "state": "running",
            "started": time.time(),
            "progress": None,
            "report": None,
            "error": None,
        }
        self.jobs[job_id] = job

        def progress(update: Any) -> None:
            job["progress"] = dataclasses.asdict(update)

        async def run() -> None:
            try:
                report = await work(progress)
            except BKError as error:
                job["state"], job["error"] = "failed", f"{type(error).__name__}: {error}"
                return
            job["report"] = report.to_dict()
            job["state"] = "done" if report.complete else "incomplete"

        def failed(error: BaseException) -> None:  # Logged and counted by spawn_job.
            job["state"], job["error"] = "failed", f"{type(error).__name__}: {error}"

        task = spawn_job(f"admin-job-{job_id}", run, kind="admin_job", on_failure=failed)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job_id

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
