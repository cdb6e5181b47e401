"""Admin HTTP: autorecovery, through the same calls as `bkaio shell ...` (docs/autorecovery.md).

GET  /api/v1/autorecovery/status                      {"enabled": bool}
PUT  /api/v1/autorecovery/status?enabled=true|false   the cluster-wide switch (token)
GET  /api/v1/autorecovery/who_is_auditor              {"auditor": id or null}
GET  /api/v1/autorecovery/list_under_replicated_ledger?missingreplica=B&
         excludingmissingreplica=B&printmissingreplica    [{ledger_id, missing_bookies, ...}]
                                                      (printmissingreplica: {id: [bookies]})
PUT  /api/v1/autorecovery/bookie       {"bookie_src": id}  recover a dead bookie (token)
PUT  /api/v1/autorecovery/decommission {"bookie_src": id}  drain a live bookie (token)
GET  /api/v1/autorecovery/jobs[?id=N]  progress and report of recover/decommission jobs
PUT  /api/v1/autorecovery/trigger_audit                the elected auditor audits now, from any
                                                      bookie: {"requested": true, "auditor": id}
                                                      (token; 503: no auditor elected, or no
                                                      metadata)
GET  /api/v1/autorecovery/lost_bookie_recovery_delay   {"delay_seconds": s, "source": ...}
PUT  /api/v1/autorecovery/lost_bookie_recovery_delay {"delay_seconds": s or null}  (token)
GET  /api/v1/autorecovery/ledger_key?ledger_id=N       master key this bookie recorded for
                                                       the ledger (token; for replicators)
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from bkaio import autorecovery
from bkaio.errors import MetadataError
from bkaio.security.tls import bookie_client_tls_context

from .admin_http import (
    AdminHost,
    BadRequest,
    NotFound,
    answering,
    guarded,
    json_body,
    json_error,
    metadata_of,
    query_choice,
    query_int,
)


def add_autorecovery_routes(app: web.Application, host: AdminHost) -> None:
    routes = _AutorecoveryRoutes(host)
    base = "/api/v1/autorecovery"
    add_get, add_put = app.router.add_get, app.router.add_put
    add_get(f"{base}/status", answering(routes.get_status))
    add_put(f"{base}/status", guarded(host, routes.put_status))
    add_get(f"{base}/who_is_auditor", answering(routes.who_is_auditor))
    add_get(f"{base}/list_under_replicated_ledger", answering(routes.list_under_replicated))
    add_put(f"{base}/bookie", guarded(host, routes.job_starter("recover")))
    add_put(f"{base}/decommission", guarded(host, routes.job_starter("decommission")))
    add_get(f"{base}/jobs", answering(routes.jobs))
    add_put(f"{base}/trigger_audit", guarded(host, routes.trigger_audit))
    add_get(f"{base}/lost_bookie_recovery_delay", answering(routes.get_lost_bookie_delay))
    add_put(f"{base}/lost_bookie_recovery_delay", guarded(host, routes.put_lost_bookie_delay))
    add_get(f"{base}/ledger_key", guarded(host, routes.ledger_key))


class _AutorecoveryRoutes:
    def __init__(self, host: AdminHost) -> None:
        self.host = host

    async def get_status(self, request: web.Request) -> web.Response:
        enabled = await autorecovery.is_autorecovery_enabled(metadata_of(self.host))
        return web.json_response({"enabled": enabled})

    async def put_status(self, request: web.Request) -> web.Response:
        value = query_choice(request, "enabled", ("true", "false"), default=None)
        if value is None:
            raise BadRequest("query parameter enabled=true|false is required")
        await autorecovery.set_autorecovery_enabled(metadata_of(self.host), value == "true")
        return web.json_response({"enabled": value == "true"})

    async def get_lost_bookie_delay(self, request: web.Request) -> web.Response:
        return web.json_response(await self._lost_bookie_delay())

    async def put_lost_bookie_delay(self, request: web.Request) -> web.Response:
        body = await json_body(request, '{"delay_seconds": 600} (null: each auditor\'s config)')
        if "delay_seconds" not in body:
            raise BadRequest('body must be JSON like {"delay_seconds": 600}')
        seconds = body["delay_seconds"]
        # bool is an int to Python, never a delay to an operator.
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float)
        ):
            raise BadRequest(f"delay_seconds must be a number of seconds or null, not {seconds!r}")
        # Out of range: the metadata's InvalidArgumentError, a 400 (the shell's exit 2).
        await autorecovery.set_lost_bookie_delay(metadata_of(self.host), seconds)
        return web.json_response(await self._lost_bookie_delay())

    async def _lost_bookie_delay(self) -> dict[str, object]:
        default = self.host.config.autorecovery.lost_bookie_delay_seconds
        delay = await autorecovery.get_lost_bookie_delay(metadata_of(self.host), default)
        return {"delay_seconds": delay.seconds, "source": delay.to_dict()["source"]}

    async def who_is_auditor(self, request: web.Request) -> web.Response:
        auditor = await autorecovery.who_is_auditor(metadata_of(self.host))
        return web.json_response({"auditor": auditor})

    async def list_under_replicated(self, request: web.Request) -> web.Response:
        including = request.query.get("missingreplica") or None
        excluding = request.query.get("excludingmissingreplica") or None
        records = [
            r
            for r in await autorecovery.list_under_replicated(metadata_of(self.host))
            if (including is None or including in r.missing_bookies)
            and (excluding is None or excluding not in r.missing_bookies)
        ]
        if "printmissingreplica" in request.query:  # BookKeeper's form: id -> missing bookies.
            return web.json_response({str(r.ledger_id): list(r.missing_bookies) for r in records})
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

    def job_starter(self, kind: str) -> Any:
        host = self.host

        async def start(request: web.Request) -> web.Response:
            body = await json_body(request, '{"bookie_src": "host:port"}')
            source = body.get("bookie_src")
            if isinstance(source, list) and len(source) == 1:
                source = source[0]  # BookKeeper's form: a list of bookies.
            if not isinstance(source, str) or not source:
                raise BadRequest('body must be JSON like {"bookie_src": "host:port"}')
            token = host.config.autorecovery.admin_token or host.config.admin.token
            action = (
                autorecovery.recover_bookie
                if kind == "recover"
                else autorecovery.decommission_bookie
            )
            meta = metadata_of(host)

            async def work(progress: Any) -> Any:
                # As this bookie's own autorecovery reaches the others: its client TLS (also
                # for HTTPS admin APIs, asked for master keys) and the HELLO token.
                config = host.config
                tls = await asyncio.to_thread(bookie_client_tls_context, config.tls)
                return await action(
                    meta,
                    source,
                    progress,
                    admin_token=token,
                    tls=tls,
                    auth_token=config.server.auth_token or None,
                )

            job_id = host.jobs.start(kind, source, work)
            return web.json_response(host.jobs.jobs[job_id], status=202)

        return start

    async def jobs(self, request: web.Request) -> web.Response:
        if "id" not in request.query:
            return web.json_response(list(self.host.jobs.jobs.values()))
        job_id = query_int(request, "id")
        job = self.host.jobs.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return web.json_response(job)

    async def trigger_audit(self, request: web.Request) -> web.Response:
        # As `bkaio shell triggeraudit` does: the request goes through the metadata, where the
        # elected auditor watches for it, whichever bookie (or `bkaio autorecovery`) it runs in.
        try:
            auditor = await autorecovery.trigger_audit(metadata_of(self.host))
        except MetadataError as error:
            return json_error(503, f"audit not requested: {error}", type(error).__name__)
        if auditor is None:
            # An auditor elected later audits then, but only bookies lost past the delay: it
            # never sees this request (it watches for requests from its election on).
            return json_error(
                503,
                "no auditor is elected now, so none audits on this request; autorecovery runs "
                "in bookies with [autorecovery] enabled and in `bkaio autorecovery`",
                "NoAuditor",
            )
        return web.json_response({"requested": True, "auditor": auditor})

    async def ledger_key(self, request: web.Request) -> web.Response:
        ledger_id = query_int(request, "ledger_id")
        key = await self.host.ledger_key(ledger_id)
        return web.json_response({"ledger_id": ledger_id, "master_key": key})
