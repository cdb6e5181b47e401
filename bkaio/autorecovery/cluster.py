"""What autorecovery needs of the cluster: the live bookie view, bookie connections, placement,
and the master keys of ledgers.

`ClusterView` follows the bookie registry (a watch), and builds the ledger client's public
pieces on it: a `BookiePool` (RECOVERY_ADD / READ_ENTRY to one named bookie), the placement
policy, and a `ClientContext` for `LedgerRecovery` (fence and close an open ledger).

Master keys: ledger metadata keeps only a hash of the ledger's master key (the writer's
password never reaches metadata), yet a replacement bookie must learn the right key, or the
writer's next add there would be refused (UNAUTHORIZED). A bookie that holds the ledger knows
the key; `MasterKeys` asks the admin HTTP of the ledger's live bookies
(`GET /api/v1/autorecovery/ledger_key`, Bearer admin token; HTTPS with the process's TLS
context when the bookie registered an https:// admin URL) and checks the answer against the
hash in the metadata before using it. Each request names the bookie it is for: a registered
admin URL that reaches another bookie (a loopback admin.host followed from another host) is
refused there (409) and counts as that bookie failing to answer, with an error naming
admin.host; never is the other bookie's "no key here" taken for this one's. A loopback admin URL
of a bookie advertised on another address is warned about once per bookie.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ssl
from collections.abc import Sequence
from functools import partial
from typing import Any

import aiohttp
import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.placement import BookieCandidate, PlacementPolicy, make_placement
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import BookieInfo, LedgerMetadata, Metadata
from bkaio.protocol.digest import password_check
from bkaio.security.admin_client import (
    ADMIN_CLIENT_TLS_SETTINGS,
    AdminTlsMismatchError,
    AdminWrongBookieError,
    admin_headers,
    admin_request_ssl,
    loopback_admin_url_of_remote,
    raise_if_wrong_bookie,
)
from bkaio.supervision import Restart, loop_supervisor

from .fragments import ReplicationError

log = structlog.get_logger(__name__)

_RETRY_WATCH_MIN_SECONDS = 0.2
_RETRY_WATCH_MAX_SECONDS = 5.0
_KEY_HTTP_TIMEOUT_SECONDS = 5.0
# Keys remembered (the latest learned): a service replicating ledger after ledger for months
# kept every key it ever learned. A ledger's copies need its key for minutes at most.
_KEY_CACHE_SIZE = 4096


def key_matches(metadata: LedgerMetadata, master_key: bytes) -> bool:
    """Whether `master_key` is the ledger's, by the hash its metadata keeps.

    Metadata without a hash accepts any key.
    """
    if not metadata.password_hash:
        return True
    return hmac.compare_digest(password_check(master_key), metadata.password_hash)


class ClusterView:
    """The registered bookies (kept current by a registry watch) and connections to them."""

    def __init__(
        self,
        metadata: Metadata,
        *,
        client_config: ClientConfig | None = None,
        placement: str = "default",
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.metadata = metadata
        # Generous timeouts: a copy waits out a busy bookie; a dead one fails fast anyway
        # (connection refused).
        self.client_config = client_config or ClientConfig(
            client_id="bkaio-autorecovery", add_timeout=15.0, read_timeout=15.0
        )
        self._bookies: list[BookieInfo] = []
        self._known: dict[str, BookieInfo] = {}  # Also bookies that left: old segments name them.
        self.placement: PlacementPolicy = make_placement(placement)
        self.pool = BookiePool(self.client_config, self._known.get, tls=tls)
        self.context = ClientContext(
            ops=self.pool,
            ledgers=metadata.ledgers,
            placement=self.placement,
            bookies=self._candidates,
            config=self.client_config,
        )
        self.changed = asyncio.Event()  # Set on every new bookie list.
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = loop_supervisor().spawn(
            "autorecovery_bookie_watch",
            partial(self._watch, first),
            Restart(),
            instance=str(id(self)),
        )
        await first

    async def _watch(self, first: asyncio.Future[None]) -> None:
        backoff = Backoff(_RETRY_WATCH_MIN_SECONDS, _RETRY_WATCH_MAX_SECONDS)
        while True:
            try:
                async for bookies in self.metadata.bookies.watch():
                    self.set_bookies(bookies)
                    backoff.reset()
                    if not first.done():
                        first.set_result(None)
            except BKError as error:
                log.warning("autorecovery_bookie_watch_failed", error=str(error))
                if not first.done():
                    first.set_exception(error)
                    return
            await asyncio.sleep(backoff.next_delay())

    def set_bookies(self, bookies: Sequence[BookieInfo]) -> None:
        self._bookies = list(bookies)
        for info in bookies:
            self._known[info.bookie_id] = info
        self.changed.set()

    def _candidates(self) -> Sequence[BookieCandidate]:
        return self._bookies

    @property
    def bookies(self) -> list[BookieInfo]:
        return list(self._bookies)

    def registered(self) -> set[str]:
        """Ids of the bookies registered now (writable or read-only)."""
        return {info.bookie_id for info in self._bookies}

    def info(self, bookie_id: str) -> BookieInfo | None:
        return self._known.get(bookie_id)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.pool.close()


class MasterKeys:
    """Learns ledgers' master keys from the bookies that hold them (see the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        admin_token: str,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """`tls`: verifies bookies whose admin API serves HTTPS (None: this process has no
        TLS, and such a bookie is refused naming what to set)."""
        self._view = view
        self._token = admin_token
        self._tls = tls
        self._cache: dict[int, bytes] = {}
        self._warned_loopback: set[str] = set()  # Bookies whose loopback admin URL was warned of.
        self._session: aiohttp.ClientSession | None = None

    async def master_key(self, metadata: LedgerMetadata) -> bytes | None:
        """The ledger's master key; None if no live bookie of the ledger has recorded one
        (nothing was ever written or fenced). ReplicationError if asking failed everywhere."""
        cached = self._cache.get(metadata.ledger_id)
        if cached is not None:
            return cached
        registered = self._view.registered()
        candidates: list[str] = []
        for _, ensemble in reversed(metadata.ensembles):  # Newest segments hold newest data.
            for bookie_id in ensemble:
                if bookie_id in registered and bookie_id not in candidates:
                    candidates.append(bookie_id)
        errors: list[str] = []
        answered = False
        for bookie_id in candidates:
            try:
                key = await self._ask(bookie_id, metadata.ledger_id)
            except (AdminTlsMismatchError, AdminWrongBookieError) as error:
                errors.append(f"{bookie_id}: {error}")
                continue
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as error:
                errors.append(f"{bookie_id}: {error!r}")
                continue
            answered = True
            if key is None:
                continue
            if not key_matches(metadata, key):
                errors.append(f"{bookie_id}: its key does not match the ledger's password hash")
                continue
            if len(self._cache) >= _KEY_CACHE_SIZE:
                del self._cache[next(iter(self._cache))]  # The one learned longest ago.
            self._cache[metadata.ledger_id] = key
            return key
        if answered and not errors:
            return None
        raise ReplicationError(
            f"ledger {metadata.ledger_id}: no live bookie gave its master key "
            f"(asked {candidates or 'nobody: none of its bookies is registered'}; {errors})"
        )

    async def _ask(self, bookie_id: str, ledger_id: int) -> bytes | None:
        info = self._view.info(bookie_id)
        if info is None or not info.admin_url:
            raise ValueError(f"bookie {bookie_id} registered no admin URL")
        ssl_arg = admin_request_ssl(
            info.admin_url, self._tls, tls_setting=ADMIN_CLIENT_TLS_SETTINGS
        )
        self._warn_if_loopback(info)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=_KEY_HTTP_TIMEOUT_SECONDS)
            )
        url = f"{info.admin_url}/api/v1/autorecovery/ledger_key"
        async with self._session.get(
            url,
            params={"ledger_id": str(ledger_id)},
            headers=admin_headers(bookie_id, self._token),
            ssl=ssl_arg,
        ) as response:
            body: Any = await response.json(content_type=None)
            raise_if_wrong_bookie(bookie_id, info.admin_url, response.status, body)
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}: {body}")
        hex_key = body["master_key"]
        return None if hex_key is None else bytes.fromhex(hex_key)

    def _warn_if_loopback(self, info: BookieInfo) -> None:
        """Once per bookie: its admin URL is on loopback though it is advertised elsewhere, so
        only a process on its host reaches it (the request's bookie id keeps any other safe)."""
        if info.bookie_id in self._warned_loopback:
            return
        if not loopback_admin_url_of_remote(info.admin_url, info.host):
            return
        self._warned_loopback.add(info.bookie_id)
        log.warning(
            "bookie_admin_url_on_loopback",
            bookie_id=info.bookie_id,
            admin_url=info.admin_url,
            advertised_host=info.host,
            hint="only a process on the bookie's own host reaches it: set the bookie's "
            "admin.host to its advertised_host (or 0.0.0.0) for autorecovery on other hosts "
            "(docs/deployment.md)",
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
