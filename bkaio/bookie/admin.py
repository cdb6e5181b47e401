"""Admin HTTP of a bookie (aiohttp, 127.0.0.1 by default), served by the parent process.

    app = build_admin_app(host)     # host: the parent, seen as `AdminHost` (admin_http.py)

The routes live by topic: admin_bookie.py (this bookie, its cluster's bookies, its config),
admin_ledger.py (/api/v1/ledger/...), admin_autorecovery.py (/api/v1/autorecovery/...). Paths and
parameters are BookKeeper's admin REST API's (docs/operations.md maps each one). Modifying
endpoints need `Authorization: Bearer <admin.token>` (compared in constant time): 401 without
it, 403 with a wrong one, and 403 for everyone when no token is configured. A bad parameter is a
400 with a JSON error `{"error": ..., "kind": ...}`, never a 500; every other error is JSON
too, aiohttp's own included (404 an unknown path, 405 a wrong method: `json_errors`). A request
whose `X-Bkaio-Bookie-Id` header names another bookie is refused on every route (409,
admin_http.py).
"""

from __future__ import annotations

from aiohttp import web

from .admin_autorecovery import add_autorecovery_routes
from .admin_bookie import add_bookie_routes
from .admin_http import AdminHost, bookie_id_check, json_errors
from .admin_ledger import add_ledger_routes

__all__ = ["AdminHost", "build_admin_app"]


def build_admin_app(host: AdminHost) -> web.Application:
    app = web.Application(
        client_max_size=64 * 1024,  # Admin bodies are tiny JSON.
        middlewares=[json_errors(host.metrics_registry), bookie_id_check(host.config.bookie_id)],
    )
    add_bookie_routes(app, host)
    add_ledger_routes(app, host)
    add_autorecovery_routes(app, host)
    return app
