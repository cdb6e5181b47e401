"""Admin HTTP: this bookie, the bookies of its cluster, and its configuration.

    GET  /heartbeat                       "OK" (liveness)
    GET  /status                          the state, as GET /api/v1/bookie/state
    GET  /health                          200 while healthy; 503 and the reason once a task
                                          failed for good (bkaio/supervision.py)
    GET  /metrics                         Prometheus text, summed over the shards
    GET  /api/v1/bookie/info              identity, shards, scrub status, freeSpace/totalSpace
    GET  /api/v1/bookie/state             running, readOnly, shuttingDown, ... (and ours)
    PUT  /api/v1/bookie/state             {"read_only": bool}: force read-only on/off (token)
    GET  /api/v1/bookie/state/readonly    {"readOnly": bool}
    PUT  /api/v1/bookie/state/readonly    {"readOnly": bool} (token)
    GET  /api/v1/bookie/is_ready          200 when every shard listens and it is registered
                                          (its lease confirmed or in doubt); 503
    GET  /api/v1/bookie/gc                {"is_in_force_gc": bool}
    PUT  /api/v1/bookie/gc                garbage collection on every shard now (token)
    GET  /api/v1/bookie/gc_details        per shard: GC and compaction runs, times, in progress
    GET  /api/v1/bookie/last_log_mark     per journal: the checkpoint mark (file id, offset)
    GET  /api/v1/bookie/list_disk_file?file_type=journal|entrylog|index
    GET  /api/v1/bookie/list_bookies?type=rw|ro&print_hostnames=true|false
    GET  /api/v1/bookie/list_bookie_info  {bookie: {free, total}, ..., "clusterInfo": {...}}
    GET  /api/v1/bookie/cluster_info      instance id, bookies by state, ledgers, auditor
    GET  /api/v1/config/server_config     the effective configuration, secrets hidden

The paths, parameters and BookKeeper's field names are those of BookKeeper's admin REST API;
docs/operations.md lists where bkaio answers differently.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bkaio.errors import BKError
from bkaio.meta.bookies import RegistrationState
from bkaio.meta.cluster_admin import describe_cluster
from bkaio.security.tls import bookie_client_tls_context
from bkaio.security.tokens import redact_uri

from .admin_http import (
    AdminHost,
    BadRequest,
    answering,
    guarded,
    json_body,
    metadata_of,
    query_bool,
    query_choice,
)
from .offline import FILE_KINDS, last_marks, list_files
from .probe import probe_bookie

PROBE_CONCURRENCY = 16  # list_bookie_info asks this many bookies at a time.
# The registration states (the admin state's "registration") in which the bookie is ready.
READY_REGISTRATIONS = frozenset(
    {RegistrationState.REGISTERED.value, RegistrationState.UNCONFIRMED.value}
)
_SECRET = "***"


def add_bookie_routes(app: web.Application, host: AdminHost) -> None:
    routes = _BookieRoutes(host)
    add_get, add_put = app.router.add_get, app.router.add_put
    add_get("/heartbeat", routes.heartbeat)
    add_get("/status", answering(routes.get_state))
    add_get("/health", routes.health)
    add_get("/metrics", routes.metrics)
    base = "/api/v1/bookie"
    add_get(f"{base}/info", answering(routes.info))
    add_get(f"{base}/state", answering(routes.get_state))
    add_put(f"{base}/state", guarded(host, routes.put_state))
    add_get(f"{base}/state/readonly", answering(routes.get_read_only))
    add_put(f"{base}/state/readonly", guarded(host, routes.put_read_only))
    add_get(f"{base}/is_ready", answering(routes.is_ready))
    add_get(f"{base}/gc", answering(routes.gc_running))
    add_put(f"{base}/gc", guarded(host, routes.run_gc))
    add_get(f"{base}/gc_details", answering(routes.gc_details))
    add_get(f"{base}/last_log_mark", answering(routes.last_log_mark))
    add_get(f"{base}/list_disk_file", answering(routes.list_disk_file))
    add_get(f"{base}/list_bookies", answering(routes.list_bookies))
    add_get(f"{base}/list_bookie_info", answering(routes.list_bookie_info))
    add_get(f"{base}/cluster_info", answering(routes.cluster_info))
    add_get("/api/v1/config/server_config", answering(routes.server_config))


class _BookieRoutes:
    def __init__(self, host: AdminHost) -> None:
        self.host = host

    async def heartbeat(self, request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def health(self, request: web.Request) -> web.Response:
        state = self.host.state()
        body = {"healthy": state["healthy"], "reason": state["unhealthy_reason"]}
        return web.json_response(body, status=200 if state["healthy"] else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        await self.host.refresh_metrics()
        body = generate_latest(self.host.metrics_registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(await self.host.info())

    def _state(self) -> dict[str, Any]:
        state = self.host.state()
        return {
            **state,
            "readOnly": state["read_only"],
            "shuttingDown": state["shutting_down"],
            "availableForHighPriorityWrites": state["running"] and not state["shutting_down"],
        }

    async def get_state(self, request: web.Request) -> web.Response:
        return web.json_response(self._state())

    async def put_state(self, request: web.Request) -> web.Response:
        body = await json_body(request, '{"read_only": true}')
        value = body.get("read_only")
        if not isinstance(value, bool):
            raise BadRequest('body must be JSON like {"read_only": true}')
        await self.host.set_forced_read_only(value)
        return web.json_response(self._state())

    async def get_read_only(self, request: web.Request) -> web.Response:
        return web.json_response({"readOnly": self.host.state()["read_only"]})

    async def put_read_only(self, request: web.Request) -> web.Response:
        body = await json_body(request, '{"readOnly": true}')
        value = body.get("readOnly")
        if not isinstance(value, bool):
            raise BadRequest('body must be JSON like {"readOnly": true}')
        await self.host.set_forced_read_only(value)
        return web.json_response({"readOnly": self.host.state()["read_only"]})

    async def is_ready(self, request: web.Request) -> web.Response:
        state = self._state()
        # A registration whose lease is in doubt is still ready: the bookie serves its clients
        # as before, and the store settles the doubt within one refresh attempt.
        advertised = state["registration"] in READY_REGISTRATIONS
        ready = state["running"] and advertised and not state["shutting_down"]
        return web.json_response(state, status=200 if ready else 503)

    async def gc_running(self, request: web.Request) -> web.Response:
        details = await self.host.gc_details()
        return web.json_response({"is_in_force_gc": any(d.get("gc_running") for d in details)})

    async def run_gc(self, request: web.Request) -> web.Response:
        return web.json_response({"shards": await self.host.run_gc()})

    async def gc_details(self, request: web.Request) -> web.Response:
        return web.json_response(await self.host.gc_details())

    async def last_log_mark(self, request: web.Request) -> web.Response:
        marks = await asyncio.to_thread(last_marks, self.host.config)
        return web.json_response({mark.journal_dir: mark.to_dict() for mark in marks})

    async def list_disk_file(self, request: web.Request) -> web.Response:
        wanted = query_choice(request, "file_type", FILE_KINDS, default=None)
        kinds = FILE_KINDS if wanted is None else (wanted,)
        files = await asyncio.to_thread(list_files, self.host.config, kinds)
        return web.json_response(
            {f"{kind} files": [f.path for f in files if f.kind == kind] for kind in kinds}
        )

    async def list_bookies(self, request: web.Request) -> web.Response:
        kind = query_choice(request, "type", ("rw", "ro"), default="rw")
        hostnames = query_bool(request, "print_hostnames")
        bookies = await metadata_of(self.host).bookies.list()
        chosen = [b for b in bookies if b.read_only == (kind == "ro")]
        return web.json_response({b.bookie_id: b.host if hostnames else None for b in chosen})

    async def list_bookie_info(self, request: web.Request) -> web.Response:
        bookies = await metadata_of(self.host).bookies.list()
        config = self.host.config
        tls = bookie_client_tls_context(config.tls)
        limit = asyncio.Semaphore(PROBE_CONCURRENCY)

        async def one(host: str, port: int) -> dict[str, Any]:
            async with limit:
                try:
                    space = await probe_bookie(
                        host, port, tls=tls, auth_token=config.server.auth_token
                    )
                except (OSError, BKError, TimeoutError) as error:
                    return {"error": f"{type(error).__name__}: {error}"}
            return {"free": space.free_bytes, "total": space.total_bytes}

        answers = await asyncio.gather(*(one(b.host, b.port) for b in bookies))
        output: dict[str, Any] = {b.bookie_id: a for b, a in zip(bookies, answers, strict=True)}
        reached = [a for a in answers if "free" in a]
        output["clusterInfo"] = {
            "total_free": sum(int(a["free"]) for a in reached),
            "total": sum(int(a["total"]) for a in reached),
        }
        return web.json_response(output)

    async def cluster_info(self, request: web.Request) -> web.Response:
        info = await describe_cluster(metadata_of(self.host))
        return web.json_response(info.to_dict())

    async def server_config(self, request: web.Request) -> web.Response:
        return web.json_response(redacted_config(self.host))


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def redacted_config(host: AdminHost) -> dict[str, Any]:
    """The bookie's effective configuration as JSON, tokens and passwords hidden."""
    config = host.config
    # asdict recurses into the sections and the storage list; _plain makes paths and tuples JSON.
    plain: dict[str, Any] = _plain(dataclasses.asdict(config))
    plain["metadata"]["uri"] = redact_uri(config.metadata.uri)
    for section, key in (
        ("admin", "token"),
        ("autorecovery", "admin_token"),
        ("server", "auth_token"),
    ):
        if plain[section][key]:
            plain[section][key] = _SECRET
    return plain
