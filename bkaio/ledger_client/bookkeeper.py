"""`BookKeeper`: the ledger client (docs/client.md): ledgers, and nothing built on them.

Owns the metadata connection, the bookie view (a watch on the registry: bookies joining,
leaving, turning read-only), the connection pool and the placement policy, and hands them to
the ledger handles it creates. Streams build on it (`bkaio.stream`); the object applications
hold, `bkaio.BookKeeper` (bkaio/client.py), is this class with `namespace()` added, so that
this package never imports the stream package.
"""

from __future__ import annotations

import asyncio
import hmac
import random
import ssl
import weakref
from collections.abc import AsyncIterator, Coroutine, Generator, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog

from bkaio.backoff import Backoff
from bkaio.errors import BKError, ConfigError, UnauthorizedError
from bkaio.ledger_client.arguments import check_count, check_ledger_id, check_password
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.context import ClientContext, LedgerStore
from bkaio.ledger_client.errors import InvalidArgumentError
from bkaio.ledger_client.ledger_handle import LedgerHandle
from bkaio.ledger_client.placement import BookieCandidate, make_placement
from bkaio.ledger_client.read_handle import ReadHandle
from bkaio.ledger_client.recovery import (
    FENCED_RECOVERY_READS,
    LedgerRecovery,
    RecoveryReadPolicy,
)
from bkaio.ledger_client.types import BookieOps, ClientConfig
from bkaio.meta.bookies import BookieInfo
from bkaio.meta.ledger_metadata import DigestType, LedgerMetadata
from bkaio.protocol.digest import master_key, password_check
from bkaio.security.tokens import redact_uri
from bkaio.supervision import Degrade, Supervisor

if TYPE_CHECKING:
    from bkaio.meta import Metadata

log = structlog.get_logger(__name__)

_Client = TypeVar("_Client", bound="BookKeeper")

_REGISTRY_RETRY_SECONDS = 1.0


def password_hash(password: bytes, ledger_id: int) -> bytes:
    """What ledger metadata stores to check a password: a hash of the ledger's master key (not
    the key), which bookies also use to check the key of a ledger they have not seen yet."""
    return password_check(master_key(password, ledger_id))


class BookKeeper:
    """A client of one bkaio cluster: creates, opens, recovers, reads and deletes ledgers.

    Get one with `BookKeeper.connect(uri, **options)` (an async context manager that can also
    be awaited). The constructor is for tests that bring their own pieces; `recovery_reads`
    keeps its production default except in the fault suite's mutation check.
    """

    def __init__(
        self,
        *,
        ledgers: LedgerStore,
        ops: BookieOps,
        config: ClientConfig,
        metadata: Metadata | None = None,
        rng: random.Random | None = None,
        recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS,
    ) -> None:
        self._metadata = metadata
        self._recovery_reads = recovery_reads
        self._bookies: list[BookieInfo] = []
        self._known: dict[str, BookieInfo] = {}
        self.config = config
        self._ops = ops
        rng = rng or random.Random()
        self._context = ClientContext(
            ops=ops,
            ledgers=ledgers,
            placement=make_placement(config.placement, rng),
            bookies=self._writable_view,
            config=config,
            rng=rng,
        )
        # Runs the registry watch (`_start_bookie_watch`); the handles' one-shot jobs run
        # under `bkaio.supervision.spawn_job` on their own.
        self._supervisor: Supervisor | None = None
        # Write handles still referenced: close stops them (`LedgerHandle.client_closed`), their
        # ensemble changes and explicit-LAC pushes, which would outlive the pool otherwise.
        self._write_handles: weakref.WeakSet[LedgerHandle] = weakref.WeakSet()
        self._closed = False

    # ----------------------------------------------------------------- connecting

    @classmethod
    def connect(cls: type[_Client], uri: str, **options: Any) -> _Connecting[_Client]:
        """Connect to the cluster whose metadata lives at `uri` (etcd://... or sqlite://...).

        Options: tls (ssl.SSLContext), metadata_timeout (seconds to wait for the metadata
        store's first answer, default 5), auth_token, add_timeout, read_timeout, placement
        ("default" | "rack_aware"), client_id, and the other fields of `ClientConfig`.
        A store that holds no initialised cluster is refused (ClusterNotInitialisedError).
        Use as `async with BookKeeper.connect(uri) as bk:` or `bk = await BookKeeper.connect(uri)`
        followed by `await bk.close()`.
        """
        return _Connecting(cls._open(uri, **options))

    @classmethod
    async def _open(cls: type[_Client], uri: str, **options: Any) -> _Client:
        from bkaio.meta import open_metadata

        tls = options.pop("tls", None)
        metadata_timeout = options.pop("metadata_timeout", None)
        if tls is not None and not isinstance(tls, ssl.SSLContext):
            raise ConfigError(f"tls must be an ssl.SSLContext or None, got {type(tls).__name__}")
        try:
            config = ClientConfig(**options)
        except TypeError as error:
            raise ConfigError(f"BookKeeper.connect: {error}") from None
        metadata = await open_metadata(uri, connect_timeout_seconds=metadata_timeout)
        try:
            known: dict[str, BookieInfo] = {}
            pool = BookiePool(config, known.get, tls=tls)
            client = cls(ledgers=metadata.ledgers, ops=pool, config=config, metadata=metadata)
            client._known = known
        except BaseException:
            await metadata.close()
            raise
        try:
            await client._start_bookie_watch()
        except BaseException:
            await client.close()
            raise
        log.info("bookkeeper_connected", uri=redact_uri(uri), bookies=len(client._bookies))
        return client

    async def _start_bookie_watch(self) -> None:
        """Follow the registry under a supervisor; return once the first view is in."""
        first_view: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def broken(error: BaseException) -> None:
            # A bug (logged by the supervisor): connect fails rather than waiting forever;
            # later the watch restarts and the view goes on from where it was.
            if not first_view.done():
                failure = BKError(f"bookie registry watch failed: {type(error).__name__}")
                failure.__cause__ = error
                first_view.set_exception(failure)

        self._supervisor = Supervisor("bkaio-client")
        self._supervisor.spawn(
            "bookie-watch",
            partial(self._watch_bookies, first_view),
            Degrade(broken, initial_delay_seconds=_REGISTRY_RETRY_SECONDS),
        )
        await first_view

    async def _watch_bookies(self, first_view: asyncio.Future[None]) -> None:
        assert self._metadata is not None, "a bookie watch needs a metadata connection"
        registry = self._metadata.bookies
        backoff = Backoff(_REGISTRY_RETRY_SECONDS / 5, _REGISTRY_RETRY_SECONDS * 5)
        while True:
            try:
                async for bookies in registry.watch():
                    self.set_bookies(bookies)
                    backoff.reset()
                    if not first_view.done():
                        first_view.set_result(None)
            except BKError as error:
                log.warning("bookie_watch_failed", error=str(error))
                if not first_view.done():
                    first_view.set_exception(error)
                    return
            await asyncio.sleep(backoff.next_delay())  # Metadata unreachable: jittered.

    def set_bookies(self, bookies: Sequence[BookieInfo]) -> None:
        """Replace the current view of registered bookies (the registry watch calls this)."""
        self._bookies = list(bookies)
        for info in bookies:
            self._known[info.bookie_id] = info  # Kept after it leaves: old ledgers name it.

    def _writable_view(self) -> Sequence[BookieCandidate]:
        return self._bookies

    @property
    def metadata(self) -> Metadata | None:
        """The metadata connection this client uses (None when built from test fakes)."""
        return self._metadata

    @property
    def bookies(self) -> list[BookieInfo]:
        """The registered bookies as last seen (writable and read-only)."""
        return list(self._bookies)

    async def close(self) -> None:
        """Stop watching, close every bookie connection and the metadata connection."""
        if self._closed:
            return
        self._closed = True
        for handle in list(self._write_handles):
            await handle.client_closed()
        if self._supervisor is not None:
            await self._supervisor.stop()
        await self._ops.close()
        if self._metadata is not None:
            await self._metadata.close()

    async def __aenter__(self) -> BookKeeper:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # ----------------------------------------------------------------- ledgers

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        custom_metadata: dict[str, bytes] | None = None,
    ) -> LedgerHandle:
        """Create a ledger on `ensemble_size` writable bookies and open it for writing.

        Needs ints (not bools) with ensemble_size >= write_quorum >= ack_quorum >= 1 and a
        bytes-like password (InvalidArgumentError, before anything is asked of the metadata);
        NotEnoughBookiesError when fewer writable bookies are registered.
        """
        for name, size in (
            ("ensemble_size", ensemble_size),
            ("write_quorum", write_quorum),
            ("ack_quorum", ack_quorum),
        ):
            check_count(size, name)
        if not ack_quorum <= write_quorum <= ensemble_size:
            raise InvalidArgumentError(
                f"need ensemble_size ({ensemble_size}) >= write_quorum ({write_quorum}) >= "
                f"ack_quorum ({ack_quorum}) >= 1"
            )
        password = check_password(password)
        custom = dict(custom_metadata or {})
        for key, value in custom.items():
            if not isinstance(key, str) or not isinstance(value, bytes):
                raise InvalidArgumentError(
                    f"custom_metadata must map str to bytes; {key!r} -> {type(value).__name__}"
                )
        ensemble = self._context.placement.new_ensemble(self._bookies, ensemble_size, write_quorum)
        # The master key depends on the ledger id, so the id is taken before the record is
        # written: bookies check the first key they see against this record's password hash.
        ledgers = self._context.ledgers
        ledger_id = await ledgers.next_id()
        metadata = await ledgers.create(
            LedgerMetadata(
                ledger_id=ledger_id,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                ensembles=((0, ensemble),),
                digest_type=DigestType.CRC32C,
                password_hash=password_hash(password, ledger_id),
                custom_metadata=custom,
            )
        )
        log.info("ledger_created", ledger_id=metadata.ledger_id, ensemble=list(ensemble))
        handle = LedgerHandle(self._context, metadata, master_key(password, metadata.ledger_id))
        self._write_handles.add(handle)
        return handle

    async def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open a ledger for reading.

        With `recovery` (the default) the ledger is fenced, recovered and sealed first: its
        old writer can add nothing more, and the handle reads up to the agreed last entry.
        Without, nothing is fenced and the handle reads up to the LAC. NoSuchLedgerError if
        it does not exist; UnauthorizedError on a wrong password; InvalidArgumentError unless
        `ledger_id` is an int in [0, 2**63 - 1] and the password bytes-like.
        """
        check_ledger_id(ledger_id)
        password = check_password(password)
        metadata = await self._context.ledgers.get(ledger_id)
        if metadata.password_hash and not hmac.compare_digest(
            metadata.password_hash, password_hash(password, ledger_id)
        ):
            raise UnauthorizedError(f"ledger {ledger_id}: wrong password")
        if recovery and not metadata.is_closed:
            key = master_key(password, ledger_id)
            metadata = await LedgerRecovery(
                self._context, metadata, key, self._recovery_reads
            ).run()
        handle = ReadHandle(self._context, metadata)
        if not metadata.is_closed:
            try:
                await handle.read_last_add_confirmed()
            except BKError as error:
                log.info("open_ledger_lac_unknown", ledger_id=ledger_id, error=str(error))
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata; bookies drop its entries at their next GC.

        NoSuchLedgerError if it does not exist; InvalidArgumentError unless `ledger_id` is an
        int in [0, 2**63 - 1].
        """
        check_ledger_id(ledger_id)
        await self._context.ledgers.delete(ledger_id)
        log.info("ledger_deleted", ledger_id=ledger_id)

    async def list_ledgers(self) -> AsyncIterator[int]:
        """Every ledger id in the cluster, ascending."""
        async for ledger_id in self._context.ledgers.list_ids():
            yield ledger_id

    async def get_ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's metadata record (NoSuchLedgerError if it does not exist;
        InvalidArgumentError unless `ledger_id` is an int in [0, 2**63 - 1])."""
        return await self._context.ledgers.get(check_ledger_id(ledger_id))


class _Connecting(Generic[_Client]):
    """What `BookKeeper.connect` returns: await it, or use it as an async context manager."""

    def __init__(self, opening: Coroutine[Any, Any, _Client]) -> None:
        self._opening = opening
        self._client: _Client | None = None

    def __await__(self) -> Generator[Any, None, _Client]:
        return self._opening.__await__()

    async def __aenter__(self) -> _Client:
        self._client = await self._opening
        return self._client

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()
