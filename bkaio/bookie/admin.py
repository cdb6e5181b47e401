"""Admin HTTP of a bookie (aiohttp, 127.0.0.1 by default), served by the parent process.

    GET  /heartbeat              "OK" (liveness)
    GET  /metrics                Prometheus text, summed over the shards
    GET  /api/v1/bookie/info     identity, shards, disks, free/total bytes
    GET  /api/v1/bookie/state    {running, read_only, forced_read_only, shutting_down, registered}
    PUT  /api/v1/bookie/state    {"read_only": bool}: force read-only on/off (Bearer token)
    GET  /api/v1/bookie/is_ready 200 when every shard listens and the bookie is registered

Modifying endpoints need `Authorization: Bearer <admin.token>` (compared in constant time); an
empty token in the configuration disables them.
"""

from __future__ import annotations

import hmac
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from .parent import BookieParent


def build_admin_app(parent: BookieParent) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)  # Admin bodies are tiny JSON.

    async def heartbeat(request: web.Request) -> web.Response:
        return web.Response(text="OK\n")

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

    app.router.add_get("/heartbeat", heartbeat)
    app.router.add_get("/metrics", metrics)
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
