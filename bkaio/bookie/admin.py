"""Admin HTTP of a bookie (aiohttp, 127.0.0.1 by default), served by the parent process.

    GET  /heartbeat              "OK" (liveness)
    GET  /status                 the state below, e.g. {"read_only": false, "journal_sync": true}
    GET  /health                 200 while healthy; 503 and the reason once a task failed for good
    GET  /metrics                Prometheus text, summed over the shards
    GET  /api/v1/bookie/info     identity, shards, disks, free/total bytes
    GET  /api/v1/bookie/state    {running, read_only, forced_read_only, shutting_down, registered,
                                  shards_read_only, journal_sync}
    PUT  /api/v1/bookie/state    {"read_only": bool}: force read-only on/off (Bearer token)
    GET  /api/v1/bookie/is_ready 200 when every shard listens and the bookie is registered
    PUT  /api/v1/bookie/gc       run garbage collection on every shard now (Bearer token)

Autorecovery (docs/autorecovery.md), the same actions as `bkaio shell ...`:
    GET  /api/v1/autorecovery/status                      {"enabled": bool}
    PUT  /api/v1/autorecovery/status?enabled=true|false   the cluster-wide switch (token)
    GET  /api/v1/autorecovery/who_is_auditor              {"auditor": id or null}
    GET  /api/v1/autorecovery/list_under_replicated_ledger [{ledger_id, missing_bookies, ...}]
    PUT  /api/v1/autorecovery/bookie       {"bookie_src": id}  recover a dead bookie (token)
    PUT  /api/v1/autorecovery/decommission {"bookie_src": id}  drain a live bookie (token)
    GET  /api/v1/autorecovery/jobs[?id=N]  progress and report of recover/decommission jobs
    PUT  /api/v1/autorecovery/trigger_audit                audit now, if this bookie is auditor
    GET  /api/v1/autorecovery/ledger_key?ledger_id=N       master key this bookie recorded for
                                                           the ledger (token; used by replicators)

Modifying endpoints need `Authorization: Bearer <admin.token>` (compared in constant time); an
empty token in the configuration disables them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import itertools
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bkaio.errors import BKError

if TYPE_CHECKING:
    from .parent import BookieParent


def build_admin_app(parent: BookieParent) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)  # Admin bodies are tiny JSON.

    async def heartbeat(request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def health(request: web.Request) -> web.Response:
        state = parent.state()
        body = {"healthy": state["healthy"], "reason": state["unhealthy_reason"]}
        return web.json_response(body, status=200 if state["healthy"] else 503)

    async def metrics(request: web.Request) -> web.Response:
        await parent.refresh_metrics()
        body = generate_latest(parent.metrics_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def info(request: web.Request) -> web.Response:
        return web.json_response(await parent.info())

    async def get_state(request: web.Request) -> web.Response:
        return web.json_response(parent.state())

    async def put_state(request: web.Request) -> web.Response:
        denied = _check_token(request, parent.config.admin.token)
        if denied is not None:
            return denied
        try:
            body: Any = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, 'body must be JSON like {"read_only": true}')
        if not isinstance(body, dict) or not isinstance(body.get("read_only"), bool):
            return _error(400, 'body must be JSON like {"read_only": true}')
        await parent.set_forced_read_only(body["read_only"])
        return web.json_response(parent.state())

    async def is_ready(request: web.Request) -> web.Response:
        state = parent.state()
        ready = state["running"] and state["registered"] and not state["shutting_down"]
        return web.json_response(state, status=200 if ready else 503)

    app.router.add_put("/api/v1/bookie/gc", _guarded(parent, lambda r: _gc(parent)))
    _add_autorecovery_routes(app, parent)
    app.router.add_get("/heartbeat", heartbeat)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", get_state)
    app.router.add_get("/api/v1/bookie/info", info)
    app.router.add_get("/api/v1/bookie/state", get_state)
    app.router.add_put("/api/v1/bookie/state", put_state)
    app.router.add_get("/api/v1/bookie/is_ready", is_ready)
    return app


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": message}) + "\n",
        content_type="application/json",
    )


def _check_token(request: web.Request, token: str) -> web.Response | None:
    if not token:
        return _error(403, "admin.token is not configured: modifying endpoints are disabled")
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        return _error(401, "missing or wrong 'Authorization: Bearer <admin token>'")
    return None


Handler = Callable[[web.Request], Awaitable[web.Response]]


def _guarded(parent: BookieParent, handler: Handler) -> Handler:
    """`handler` behind the admin token check."""

    async def guarded(request: web.Request) -> web.Response:
        denied = _check_token(request, parent.config.admin.token)
        if denied is not None:
            return denied
        try:
            return await handler(request)
        except BKError as error:
            return _error(500, f"{type(error).__name__}: {error}")

    return guarded


async def _gc(parent: BookieParent) -> web.Response:
    return web.json_response({"shards": await parent.run_gc()})


class AdminJobs:
    """recover/decommission jobs started over HTTP: they outlive the request that started them."""

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

        task = asyncio.get_running_loop().create_task(run(), name=f"admin-job-{job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job_id

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _add_autorecovery_routes(app: web.Application, parent: BookieParent) -> None:
    from bkaio import autorecovery

    base = "/api/v1/autorecovery"

    def metadata() -> Any:
        if parent.metadata is None:
            raise BKError("the bookie has no metadata connection yet")
        return parent.metadata

    async def get_status(request: web.Request) -> web.Response:
        enabled = await autorecovery.is_autorecovery_enabled(metadata())
        return web.json_response({"enabled": enabled})

    async def put_status(request: web.Request) -> web.Response:
        value = request.query.get("enabled", "").lower()
        if value not in ("true", "false"):
            return _error(400, "query parameter enabled=true|false is required")
        await autorecovery.set_autorecovery_enabled(metadata(), value == "true")
        return web.json_response({"enabled": value == "true"})

    async def who_is_auditor(request: web.Request) -> web.Response:
        return web.json_response({"auditor": await autorecovery.who_is_auditor(metadata())})

    async def list_under_replicated(request: web.Request) -> web.Response:
        records = await autorecovery.list_under_replicated(metadata())
        return web.json_response(
            [
                {
                    "ledger_id": r.ledger_id,
                    "missing_bookies": list(r.missing_bookies),
                    "ctime_ms": r.ctime_ms,
                }
                for r in records
            ]
        )

    async def bookie_src(request: web.Request) -> str | None:
        try:
            body: Any = await request.json()
        except (ValueError, UnicodeDecodeError):
            return None
        source = body.get("bookie_src") if isinstance(body, dict) else None
        if isinstance(source, list) and len(source) == 1:
            source = source[0]  # BookKeeper's form: a list of bookies.
        return source if isinstance(source, str) and source else None

    def job_starter(kind: str) -> Handler:
        async def start(request: web.Request) -> web.Response:
            source = await bookie_src(request)
            if source is None:
                return _error(400, 'body must be JSON like {"bookie_src": "host:port"}')
            token = parent.config.autorecovery.admin_token or parent.config.admin.token
            action = (
                autorecovery.recover_bookie
                if kind == "recover"
                else autorecovery.decommission_bookie
            )
            meta = metadata()

            async def work(progress: Any) -> Any:
                return await action(meta, source, progress, admin_token=token)

            job_id = parent.jobs.start(kind, source, work)
            return web.json_response(parent.jobs.jobs[job_id], status=202)

        return start

    async def jobs(request: web.Request) -> web.Response:
        wanted = request.query.get("id")
        if wanted is None:
            return web.json_response(list(parent.jobs.jobs.values()))
        job = parent.jobs.jobs.get(int(wanted)) if wanted.isdigit() else None
        if job is None:
            return _error(404, f"no job {wanted!r}")
        return web.json_response(job)

    async def trigger_audit(request: web.Request) -> web.Response:
        service = parent.autorecovery
        auditor = None if service is None else service.auditor
        if auditor is not None:
            auditor.trigger()
        return web.json_response({"triggered": auditor is not None})

    async def ledger_key(request: web.Request) -> web.Response:
        raw = request.query.get("ledger_id", "")
        if not raw.isdigit():
            return _error(400, "query parameter ledger_id=<non-negative integer> is required")
        key = await parent.ledger_key(int(raw))
        return web.json_response({"ledger_id": int(raw), "master_key": key})

    def public(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.Response:
            try:
                return await handler(request)
            except BKError as error:
                return _error(500, f"{type(error).__name__}: {error}")

        return wrapped

    app.router.add_get(f"{base}/status", public(get_status))
    app.router.add_put(f"{base}/status", _guarded(parent, put_status))
    app.router.add_get(f"{base}/who_is_auditor", public(who_is_auditor))
    app.router.add_get(f"{base}/list_under_replicated_ledger", public(list_under_replicated))
    app.router.add_put(f"{base}/bookie", _guarded(parent, job_starter("recover")))
    app.router.add_put(f"{base}/decommission", _guarded(parent, job_starter("decommission")))
    app.router.add_get(f"{base}/jobs", public(jobs))
    app.router.add_put(f"{base}/trigger_audit", _guarded(parent, trigger_audit))
    app.router.add_get(f"{base}/ledger_key", _guarded(parent, ledger_key))
