"""Admin HTTP: ledgers of the cluster (BookKeeper's /api/v1/ledger/... paths and parameters).

    GET    /api/v1/ledger/list?print_metadata=true|false&page=N   {"<id>": metadata or null}
    GET    /api/v1/ledger/metadata?ledger_id=N                    {"<id>": metadata}
    GET    /api/v1/ledger/read?ledger_id=N&start_entry_id=A&end_entry_id=B&page=P&password=S
                                                                  {"<entry id>": "content"}
    DELETE /api/v1/ledger/delete?ledger_id=N&force=true|false     (admin token)

`delete` refuses, 409 `LedgerNamedByStreamError` naming the stream and the segment's seqs, a
ledger a stream's record names as a segment (its records would be lost and the stream
unreadable from it on), unless `force=true`: the check `bkaio shell deleteledger` makes
(bkaio/stream/ledger_owner.py).

Answers are bounded: a page of `list` holds LIST_PAGE ledgers (metadata is only printed for at
most UNPAGED_METADATA ledgers without `page`), a `read` at most READ_PAGE entries (a longer range
needs `page`). `read` opens the ledger like any client, without fencing: `password` is the
ledger's (empty by default). Contents are UTF-8 text when printable, else `hex:...`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from aiohttp import web

from bkaio.display import ledger_metadata_dict, payload_text
from bkaio.errors import BKError, NoSuchLedgerError
from bkaio.security.tls import bookie_client_tls_context
from bkaio.stream.ledger_owner import LedgerNamedByStreamError, stream_naming_ledger

from .admin_http import (
    AdminHost,
    BadRequest,
    answering,
    guarded,
    metadata_of,
    query_bool,
    query_int,
    query_page,
)

log = structlog.get_logger(__name__)

LIST_PAGE = 100  # BookKeeper's LIST_LEDGER_BATCH_SIZE.
UNPAGED_METADATA = 1000  # print_metadata without page: at most this many ledgers.
READ_PAGE = 1000  # BookKeeper's ENTRIES_PER_PAE.


def add_ledger_routes(app: web.Application, host: AdminHost) -> None:
    routes = _LedgerRoutes(host)
    base = "/api/v1/ledger"
    app.router.add_get(f"{base}/list", answering(routes.list_ledgers))
    app.router.add_get(f"{base}/metadata", answering(routes.metadata))
    app.router.add_get(f"{base}/read", answering(routes.read))
    app.router.add_delete(f"{base}/delete", guarded(host, routes.delete))
    app.on_cleanup.append(routes.close)


class _LedgerRoutes:
    def __init__(self, host: AdminHost) -> None:
        self.host = host
        self._client: Any = None  # A BookKeeper client, made on the first read.
        self._client_lock = asyncio.Lock()

    async def _bookkeeper(self) -> Any:
        async with self._client_lock:
            if self._client is None:
                from bkaio.ledger_client import BookKeeper

                config = self.host.config
                self._client = await BookKeeper.connect(
                    config.metadata.uri,
                    client_id=f"{config.bookie_id}-admin",
                    tls=bookie_client_tls_context(config.tls),
                    auth_token=config.server.auth_token or None,
                )
            return self._client

    async def close(self, app: web.Application) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except (BKError, OSError) as error:
                log.warning("admin_client_close_failed", error=str(error))

    async def list_ledgers(self, request: web.Request) -> web.Response:
        print_metadata = query_bool(request, "print_metadata")
        page = query_page(request)
        ledgers = metadata_of(self.host).ledgers
        ids: list[int] = []
        first = (page - 1) * LIST_PAGE if page else 0
        index = 0
        async for ledger_id in ledgers.list_ids():
            if index >= first:
                ids.append(ledger_id)
            index += 1
            if page and len(ids) >= LIST_PAGE:
                break
            if print_metadata and not page and len(ids) > UNPAGED_METADATA:
                raise BadRequest(
                    f"more than {UNPAGED_METADATA} ledgers: ask for their metadata a page of "
                    f"{LIST_PAGE} at a time (page=1, 2, ...)"
                )
        if not print_metadata:
            return web.json_response({str(i): None for i in ids})
        output: dict[str, Any] = {}
        for ledger_id in ids:
            try:
                output[str(ledger_id)] = ledger_metadata_dict(await ledgers.get(ledger_id))
            except NoSuchLedgerError:
                continue  # Deleted since it was listed.
        return web.json_response(output)

    async def metadata(self, request: web.Request) -> web.Response:
        ledger_id = query_int(request, "ledger_id")
        record = await metadata_of(self.host).ledgers.get(ledger_id)
        return web.json_response({str(ledger_id): ledger_metadata_dict(record)})

    async def read(self, request: web.Request) -> web.Response:
        ledger_id = query_int(request, "ledger_id")
        start = query_int(request, "start_entry_id", default=0)
        end = query_int(request, "end_entry_id", default=-1, minimum=-1)
        page = query_page(request)
        password = request.query.get("password", "")
        if end != -1 and end < start:
            raise BadRequest(f"end_entry_id={end} is before start_entry_id={start}")
        bk = await self._bookkeeper()
        handle = await bk.open_ledger(ledger_id, password=password.encode(), recovery=False)
        last = handle.last_entry_id if handle.is_closed else await handle.read_last_add_confirmed()
        if end == -1 or end > last:
            end = last
        if page:
            start = max(start, (page - 1) * READ_PAGE)
            end = min(end, page * READ_PAGE - 1)
        if end < start:
            return web.json_response({})
        if end - start + 1 > READ_PAGE:
            raise BadRequest(
                f"entries {start}..{end} are more than {READ_PAGE}: narrow the range or read "
                f"it a page at a time (page=1, 2, ...)"
            )
        entries = await handle.read(start, end)
        return web.json_response({str(e.entry_id): payload_text(e.payload) for e in entries})

    async def delete(self, request: web.Request) -> web.Response:
        ledger_id = query_int(request, "ledger_id")
        force = query_bool(request, "force")
        metadata = metadata_of(self.host)
        owner = None if force else await stream_naming_ledger(metadata, ledger_id)
        if owner is not None:
            return web.json_response(
                {
                    "error": owner.refusal("force=true"),
                    "kind": LedgerNamedByStreamError.__name__,
                    "ledger_id": ledger_id,
                    "stream": owner.stream_name,
                    "first_seq": owner.first_seq,
                    "last_seq": owner.last_seq,
                },
                status=409,
            )
        await metadata.ledgers.delete(ledger_id)
        return web.json_response({"deleted": ledger_id})
