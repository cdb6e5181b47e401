"""`bkaio bookie info` shows the running bookie's admin `/status` only when the admin API at
its configuration's admin port is that bookie's: the request names the configuration's bookie
id, and another bookie answering there (409) is reported as an error, not shown as this one's
status (it showed whichever bookie listened on the port)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from bkaio.bookie.admin import build_admin_app
from bkaio.cli.bookie_cmd import _running_status
from tests.unit.bookie.fake_admin_host import FakeAdminHost, admin_config


async def test_the_status_is_shown_only_from_the_configured_bookie(tmp_path: Path) -> None:
    other = FakeAdminHost(admin_config(tmp_path, "127.0.0.1", 45191, "t"))
    app: web.Application = build_admin_app(other)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        port = server.port
        assert port is not None
        mine = admin_config(tmp_path, "127.0.0.1", 45181, "t", admin_port=port)
        status = await asyncio.to_thread(_running_status, mine)
        assert status is not None and set(status) == {"error"}, status
        assert status["error"].startswith(
            f"the admin API at http://127.0.0.1:{port}/status is bookie 127.0.0.1:45191's, "
            "not 127.0.0.1:45181's"
        )
        theirs = admin_config(tmp_path, "127.0.0.1", 45191, "t", admin_port=port)
        status = await asyncio.to_thread(_running_status, theirs)
        assert status is not None and status["bookie_id"] == "127.0.0.1:45191", status
    finally:
        await server.close()
