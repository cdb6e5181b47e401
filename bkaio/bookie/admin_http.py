"""What the admin HTTP modules share: the host they serve, errors, the token, parameters.

`AdminHost` is the narrow view of the bookie parent the routes need (the parent satisfies it;
admin modules never import the parent). Errors are JSON `{"error": ..., "kind": ...}` with a
status that says whose fault it is: 400 a bad parameter, 401 no admin token, 403 a wrong one (or
none configured), 404 no such thing, 503 not ready, 500 only for a failure of ours. Parameters
are parsed by `query_int` / `query_bool` / `query_choice`, which raise `BadRequest` (a 400).
aiohttp's own errors (404 an unknown path, 405 a wrong method, 413 a body too large) and a
handler's unexpected exception (500, logged and counted) are JSON too (`json_errors`).

A request naming the bookie it is meant for (header `X-Bkaio-Bookie-Id`, as every bkaio caller
sends it) that names another bookie is refused on every route, 409 `WrongBookie` naming both ids
(`bookie_id_check`): a registered admin URL that reaches the wrong bookie never acts on it or
answers for it. Requests without the header (an operator's curl) are served as before.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler as StreamHandler
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry

from bkaio.config import BookieConfig
from bkaio.errors import (
    BKError,
    InvalidArgumentError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from bkaio.meta import Metadata
from bkaio.security.admin_client import (
    ADMIN_BOOKIE_HEADER,
    WRONG_BOOKIE_KIND,
    WRONG_BOOKIE_STATUS,
)
from bkaio.supervision import task_failures_counter

from .admin_jobs import AdminJobs

log = structlog.get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]


class AdminHost(Protocol):
    """The bookie as its admin HTTP sees it (bkaio/bookie/parent.py's BookieParent)."""

    config: BookieConfig
    metrics_registry: CollectorRegistry
    jobs: AdminJobs

    @property
    def admin_metadata(self) -> Metadata | None:
        """The parent's metadata connection, once it is open."""
        ...

    def state(self) -> dict[str, Any]: ...

    async def info(self) -> dict[str, Any]: ...

    async def refresh_metrics(self) -> None: ...

    async def set_forced_read_only(self, value: bool) -> None: ...

    async def run_gc(self) -> list[dict[str, Any]]: ...

    async def gc_details(self) -> list[dict[str, Any]]: ...

    async def ledger_key(self, ledger_id: int) -> str | None: ...


class BadRequest(Exception):
    """A request parameter is missing or malformed: answered 400 with this message."""


class NotFound(Exception):
    """The thing asked for does not exist: answered 404."""


_KINDS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}


def json_error(status: int, message: str, kind: str | None = None) -> web.Response:
    body = {"error": message, "kind": kind or _KINDS.get(status, "InternalError")}
    return web.Response(
        status=status, text=json.dumps(body) + "\n", content_type="application/json"
    )


def check_token(request: web.Request, token: str) -> web.Response | None:
    """None when the request carries the admin token; else the 401/403 answer."""
    if not token:
        return json_error(
            403, "admin.token is not configured: modifying endpoints are disabled", "Forbidden"
        )
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if not header:
        return json_error(401, "this endpoint needs 'Authorization: Bearer <admin token>'")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        return json_error(403, "wrong admin token")
    return None


def bookie_id_check(bookie_id: str) -> Middleware:
    """aiohttp middleware: 409 for a request whose ADMIN_BOOKIE_HEADER names another bookie than
    `bookie_id` (this one); a request without the header goes through."""

    @web.middleware
    async def check(request: web.Request, handler: StreamHandler) -> web.StreamResponse:
        wanted = request.headers.get(ADMIN_BOOKIE_HEADER)
        if wanted is None or wanted == bookie_id:
            return await handler(request)
        body = {
            "error": f"this admin API is bookie {bookie_id}'s; the request is for bookie "
            f"{wanted} (its registered admin URL reaches another bookie: see its admin.host)",
            "kind": WRONG_BOOKIE_KIND,
            "bookie_id": bookie_id,
            "requested_bookie_id": wanted,
        }
        log.warning("admin_request_for_another_bookie", path=request.path, requested=wanted)
        return web.json_response(body, status=WRONG_BOOKIE_STATUS)

    return check


def json_errors(registry: CollectorRegistry) -> Middleware:
    """aiohttp middleware, the outermost: every error answer is JSON `{"error", "kind"}`, also
    aiohttp's own (404 for an unknown path, 405 for a method the path does not take, with its
    `Allow` header, 413 for a body too large). An exception a handler did not expect is logged
    at ERROR, counted in `registry` (`bkaio_task_failures_total{task="admin_http"}`) and
    answered 500 `InternalError`."""

    @web.middleware
    async def answer(request: web.Request, handler: StreamHandler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as error:
            if error.status < 400:
                raise  # A redirect or a success raised as an exception: aiohttp answers it.
            response = json_error(
                error.status, _http_error_message(request, error), "".join(error.reason.split())
            )
            if "Allow" in error.headers:
                response.headers["Allow"] = error.headers["Allow"]
            return response
        except Exception as error:
            log.error("admin_request_crashed", method=request.method, path=request.path,
                      error=repr(error), exc_info=True)  # fmt: skip
            task_failures_counter(registry).labels(task="admin_http").inc()
            return json_error(
                500, f"the bookie failed to answer {request.method} {request.path}: {error!r}",
                "InternalError",
            )  # fmt: skip

    return answer


def _http_error_message(request: web.Request, error: web.HTTPException) -> str:
    if isinstance(error, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(error.allowed_methods))
        return f"{request.path} does not take {request.method} (it takes {allowed})"
    if isinstance(error, web.HTTPNotFound) and request.match_info.http_exception is not None:
        return f"no admin path {request.path} (docs/operations.md lists them)"
    text = error.text or ""
    return text if text and not text.startswith(f"{error.status}: ") else error.reason


def _status_of(error: BKError) -> int:
    if isinstance(error, NoSuchLedgerError | NoSuchEntryError):
        return 404
    if isinstance(error, InvalidArgumentError):
        return 400
    if isinstance(error, UnauthorizedError):
        return 403
    return 500


def answering(handler: Handler) -> Handler:
    """`handler` with BadRequest/NotFound/BKError turned into JSON answers (never a bare 500)."""

    async def answered(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except BadRequest as error:
            return json_error(400, str(error))
        except NotFound as error:
            return json_error(404, str(error))
        except BKError as error:
            status = _status_of(error)
            if status == 500:
                log.warning("admin_request_failed", path=request.path, error=str(error))
            return json_error(status, str(error), type(error).__name__)

    return answered


def guarded(host: AdminHost, handler: Handler) -> Handler:
    """`answering(handler)` behind the admin token check."""
    inner = answering(handler)

    async def checked(request: web.Request) -> web.Response:
        denied = check_token(request, host.config.admin.token)
        if denied is not None:
            return denied
        return await inner(request)

    return checked


def metadata_of(host: AdminHost) -> Metadata:
    metadata = host.admin_metadata
    if metadata is None:
        raise BKError("the bookie has no metadata connection yet")
    return metadata


# -- parameters -------------------------------------------------------------------------------

MAX_ID = 2**63 - 1


def query_int(
    request: web.Request,
    name: str,
    *,
    default: int | None = None,
    minimum: int = 0,
    maximum: int = MAX_ID,
) -> int:
    """Query parameter `name` as an integer in [minimum, maximum]; `default` when absent
    (BadRequest when absent and no default)."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BadRequest(f"query parameter {name}=<integer> is required")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"{name}={raw!r} is not an integer") from None
    if not minimum <= value <= maximum:
        raise BadRequest(f"{name}={value} is outside [{minimum}, {maximum}]")
    return value


def query_page(request: web.Request) -> int:
    """BookKeeper's `page=N` (from 1); 0 when absent (no paging)."""
    if not request.query.get("page"):
        return 0
    return query_int(request, "page", minimum=1)


def query_bool(request: web.Request, name: str, *, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise BadRequest(f"{name}={raw!r} must be true or false")
    return lowered == "true"


def query_choice(
    request: web.Request, name: str, choices: tuple[str, ...], *, default: str | None
) -> str | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise BadRequest(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


async def json_body(request: web.Request, example: str) -> dict[str, Any]:
    """The request body as a JSON object (BadRequest naming `example` otherwise)."""
    try:
        body: Any = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise BadRequest(f"body must be JSON like {example}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be JSON like {example}")
    return body
