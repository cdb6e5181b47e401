"""Value types and the seam between the ledger handles and the bookies.

`BookieOps` is everything a ledger handle asks of bookies, by bookie id. `BookiePool`
(connections.py) implements it over the wire protocol; unit tests implement it with
in-memory `FakeBookie`s. Handles never see connections, frames or shards.
Imports nothing from asyncio's transports or the metadata store; from the codec only a
constant (`FRAME_ENVELOPE_BYTES`, which loads the `bkaio.protocol` package: the client has it
loaded anyway).
"""

from __future__ import annotations

import math
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol, TypeVar

from bkaio.errors import BKError, ConfigError
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES


class Entry(NamedTuple):
    """One entry as returned to the application.

    A NamedTuple rather than a frozen dataclass: a range read builds one per entry, and
    `tuple.__new__` over an iterator of field tuples builds them without a Python call each
    (0.15 us against 0.9 us for a frozen dataclass's __init__).
    """

    ledger_id: int
    entry_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StoredCopy:
    """One bookie's copy of an entry, exactly as the writer sent it (digest not yet checked)."""

    entry_id: int
    lac: int  # The writer's LAC when it sent the entry (piggybacked).
    length: int  # Ledger length after this entry.
    digest: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class EntriesAnswer:
    """A bookie's answer to a range read (READ_ENTRIES, docs/protocol.md "Range reads").

    Of the entries asked for, every one below `next_entry_id` that the bookie holds is in
    `records` (`bkaio.protocol.records`, ascending, digests not yet checked); those missing
    there are not stored on it. Entries from `next_entry_id` on were not looked at (a limit
    was reached): a further request continues there.
    """

    lac: int  # The bookie's LAC for the ledger (-1 when none).
    next_entry_id: int
    records: bytes


@dataclass(frozen=True, slots=True)
class LacAnswer:
    """A bookie's answer to READ_LAC."""

    lac: int  # Max of every piggybacked and explicit LAC the bookie stored; -1 when none.
    last_entry_id: int  # Highest entry id the bookie holds; -1 when none.


# Called once per add request: None when the bookie confirmed, else the reason it did not.
AddCallback = Callable[[BKError | None], None]
# What a writer keeps per add (its `PendingAdd`): handed back to the bookie's answer handler.
_Add = TypeVar("_Add")
# (first index, end index, packed entries, their bytes): one ADD_ENTRIES frame of a batch.
AddFrame = tuple[int, int, list[bytes], int]


class BookieOps(Protocol):
    """Requests to one bookie (by id) about one ledger. Timeouts are applied inside."""

    def add_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
        callback: AddCallback,
    ) -> None:
        """Send one add; `callback` runs later on the loop (never inside this call)."""

    def add_entry_many(
        self,
        targets: Sequence[tuple[str, Callable[[_Add, BKError | None], None]]],
        add: _Add,
        ledger_id: int,
        entry_id: int,
        recovery: bool,
        master_key: bytes,
        lac: int,
        length: int,
        digest: int,
        payload: bytes,
    ) -> None:
        """`add_entry` to each (bookie, handler) of `targets`; a bookie's answer calls
        `handler(add, None)` for OK, else `handler(add, error)` (later, on the loop)."""

    def add_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        recovery: bool,
        master_key: bytes,
        handler: Callable[[_Add, BKError | None], None],
        adds: Sequence[_Add],
        frames: Sequence[AddFrame],
    ) -> bool:
        """Send `adds` (packed in `frames`) to one bookie as a batch, each answer to
        `handler(add, error)`. False, having sent nothing, when that bookie takes no batch
        now (not connected yet, an older bookie): the caller sends the adds one by one."""

    def when_writable(self, bookie_id: str, ledger_id: int, callback: Callable[[], None]) -> bool:
        """True when the bookie takes no writes now (it reads too slowly): `callback` runs
        once it does again, or fails. False: nothing to wait for."""

    def defer_send(self, send: Callable[[], None]) -> None:
        """Run `send` (a handle's batch send) at the end of this loop iteration, with the
        other handles' batches, then write what they queued."""

    async def read_entry(
        self,
        bookie_id: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
    ) -> StoredCopy:
        """The bookie's copy of an entry; raises NoSuchEntryError/NoSuchLedgerError/BKError."""
        ...

    async def read_entries(
        self,
        bookie_id: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        stride: int = 1,
        max_count: int,
        max_bytes: int,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> EntriesAnswer:
        """The bookie's copies of entries first, first + stride, ... <= last: at most
        `max_count`, and past the first at most about `max_bytes` of payload.

        With `previous_lac`, a long poll: the bookie answers once its LAC passes it (or after
        `long_poll_seconds` with what it has), with the entries it holds up to that LAC only.
        NoSuchLedgerError when the bookie has no such ledger; BKError on failure.
        """
        ...

    async def read_lac(
        self,
        bookie_id: str,
        ledger_id: int,
        *,
        fence: bool = False,
        master_key: bytes | None = None,
        previous_lac: int | None = None,
        long_poll_seconds: float = 0.0,
    ) -> LacAnswer:
        """READ_LAC; with `previous_lac` it long-polls until the LAC passes it or time is up."""
        ...

    async def write_lac(self, bookie_id: str, ledger_id: int, master_key: bytes, lac: int) -> None:
        """WRITE_LAC: tell the bookie the writer's LAC explicitly."""

    async def close(self) -> None:
        """Close every connection; requests still out fail."""


# A batching wait beyond 10 ms would be a delay, not a coalescing window.
MAX_ADD_BATCH_WAIT_US = 10_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Options of one `BookKeeper` client (keyword options of `BookKeeper.connect`)."""

    add_timeout: float = 5.0  # Per bookie add; past it the bookie counts as failed.
    # A bookie that failed an add of a ledger handle is no replacement candidate for that
    # handle for this long (BookKeeper's bookieQuarantineTime); when every candidate is in
    # quarantine the handle fails with NotEnoughBookiesError instead of trying them again.
    bookie_quarantine_seconds: float = 30.0
    # Ensemble changes of one handle after the first (with no add completed in between) wait
    # a jittered, doubling delay from the min up to the max.
    ensemble_change_backoff_min: float = 0.05
    ensemble_change_backoff_max: float = 2.0
    read_timeout: float = 5.0  # Per bookie read.
    # A tail's poll round that no bookie waited in (every poll failed at once, or they answered
    # at once without news) is followed by a jittered, doubling pause from the min up to the
    # max (within the caller's timeout), reset by a round that makes progress or lasts.
    tail_backoff_min: float = 0.05
    tail_backoff_max: float = 1.0
    placement: str = "default"
    client_id: str = "bkaio-client"
    auth_token: str | None = None
    explicit_lac_interval: float = (
        0.1  # WRITE_LAC after this long without a newer piggyback; 0 = off.
    )
    # Also WRITE_LAC as soon as acknowledgements move the LAC past what the adds sent or queued
    # carry (once per loop iteration): tailing readers learn of an entry without waiting for
    # the next add or the interval. A burst waiting for company (`add_batch_wait_us`) leaves
    # then, carrying the new LAC, instead; else it costs a WRITE_LAC per burst of acks.
    explicit_lac_on_ack: bool = False
    speculative_read_timeout: float | None = None  # Ask the next replica after this; None = off.
    max_outstanding_adds: int = 10_000  # Per ledger handle: adds sent and not yet acknowledged.
    # Per ledger handle: adds held back (over max_outstanding_adds or max_outstanding_add_bytes,
    # or during an ensemble change).
    # Past it `append` raises TooManyRequestsError: the queue stays bounded whatever the caller
    # does; `await handle.wait_for_capacity()` is the cooperative way to stay below it.
    max_queued_adds: int = 100_000
    # Per ledger handle: payload bytes of the adds sent and not yet acknowledged. An append that
    # would take them past it is queued (as past max_outstanding_adds) until acknowledgements
    # free room; `wait_for_capacity()` waits for it too. One entry larger than the bound still
    # goes alone when nothing else is in flight. With wait_for_capacity, a writer holds at most
    # this plus one entry in memory per handle, whatever its entries' sizes.
    max_outstanding_add_bytes: int = 64 * 1024 * 1024
    # A burst of appends (two or more in one loop iteration, to a ledger whose every add goes
    # to every bookie) that finds nothing else coming waits for the next append at most this
    # long, so that the next burst shares its frames, the bookies' journal groups and their
    # answers (fewer wake-ups per append at moderate rates). A lone append never waits; a wait
    # that catches nothing pauses waiting for a while. 0 = off: every burst leaves at once.
    # The default outlasts one millisecond: the gap between the bursts of a writer that sends
    # what fell due once a millisecond (bkaio bench's open loop, docs/performance.md).
    add_batch_wait_us: int = 1500
    # Reads (docs/client.md "Reads"): a range request asks one bookie for this many entries
    # (of a striped segment: the ones of one stride) ...
    read_batch_entries: int = 512
    read_batch_bytes: int = 4 * 1024 * 1024  # ... and at most about this many payload bytes.
    # Read-ahead of a sequential read (`read`, `read_iter`, `read_batches`, stream readers):
    # range requests in flight, and payload bytes asked for or fetched and not yet consumed.
    read_ahead_requests: int = 16
    read_ahead_bytes: int = 32 * 1024 * 1024
    # ... and, when set, at most about this many entries asked for a second by each sequential
    # read (pieces asked for evenly spread; time a slow consumer held the read up is not made
    # up with a burst): a catch-up reader on a small cluster then leaves
    # CPU to the writers beside it (Kafka's consumer quotas, BookKeeper's replicationRateByBytes
    # for the replicator). Applies to the replicator's copying too. None: as fast as answered.
    read_ahead_entries_per_second: float | None = None
    # A ledger whose every bookie holds every entry (E = Qw) is read from one bookie of each
    # segment, chosen by the ledger id (failing over per request as always), rather than from
    # each in turn: a catch-up read then loads one bookie, and the writer's ack quorum (Qa < Qw)
    # is formed by the others; a bookie's read-ahead serves its next request. BookKeeper's
    # stickyReadsEnabled, on by default as in Pulsar. False: a sequential read rotates.
    sticky_reads: bool = True
    # Entries read one by one at a time by a range read: those a bookie's range answer lacked
    # (or had corrupt), and all of them from bookies without range reads.
    read_window: int = 64
    connect_timeout: float = 5.0
    reconnect_backoff_min: float = 0.05
    reconnect_backoff_max: float = 2.0
    max_frame_bytes: int = 8 * 1024 * 1024

    @property
    def max_entry_bytes(self) -> int:
        """The largest payload `LedgerHandle.append` takes: `max_frame_bytes` less the frame's
        envelope (`FRAME_ENVELOPE_BYTES`), as with the bookie's default server.max_entry_bytes.
        A larger one is refused before it is sent: every bookie with the default limit would
        refuse it, and that is no reason to replace them."""
        return self.max_frame_bytes - FRAME_ENVELOPE_BYTES

    def __post_init__(self) -> None:
        # Types first: the range checks compare numbers, and a NaN, a str or a bool there would
        # pass some of them (`nan < 1` is False) or fail with a TypeError naming no option.
        for name, (kind, optional) in CONFIG_FIELD_KINDS.items():
            value = getattr(self, name)
            if not ((value is None and optional) or _is_kind(value, kind)):
                kind_name = _KIND_NAMES[kind] + (" or None" if optional else "")
                raise ConfigError(f"{name}={value!r} must be {kind_name}")
        # Below, each check is written "not <the rule>": a value it does not expect fails it.
        for name in ("add_timeout", "read_timeout", "connect_timeout", "bookie_quarantine_seconds"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
        if not self.explicit_lac_interval >= 0:
            raise ConfigError(
                f"explicit_lac_interval={self.explicit_lac_interval!r} must be >= 0 (0 = off)"
            )
        speculative = self.speculative_read_timeout
        if speculative is not None and not speculative > 0:
            raise ConfigError(f"speculative_read_timeout={speculative!r} must be > 0 or None")
        at_least_one = (
            "max_outstanding_adds",
            "max_queued_adds",  # 0 would refuse every append: nothing may ever wait.
            "max_outstanding_add_bytes",
            "read_window",
            "read_batch_entries",
            "read_batch_bytes",
            "read_ahead_requests",
            "read_ahead_bytes",
        )
        for name in at_least_one:
            value = getattr(self, name)
            if not value >= 1:
                raise ConfigError(f"{name}={value!r} must be >= 1")
        if not 0 <= self.add_batch_wait_us <= MAX_ADD_BATCH_WAIT_US:
            raise ConfigError(
                f"add_batch_wait_us={self.add_batch_wait_us} must be in "
                f"[0, {MAX_ADD_BATCH_WAIT_US}] (0 = off)"
            )
        for prefix in ("ensemble_change_backoff", "tail_backoff", "reconnect_backoff"):
            low, high = getattr(self, f"{prefix}_min"), getattr(self, f"{prefix}_max")
            if not 0 < low <= high:
                raise ConfigError(f"{prefix}_min={low!r} must be in (0, {prefix}_max={high!r}]")
        pace = self.read_ahead_entries_per_second
        if pace is not None and not pace > 0:
            raise ConfigError(
                f"read_ahead_entries_per_second={pace!r} must be > 0 or None (no pace)"
            )
        if not self.max_frame_bytes > FRAME_ENVELOPE_BYTES:
            raise ConfigError(
                f"max_frame_bytes={self.max_frame_bytes} must be > {FRAME_ENVELOPE_BYTES}: a frame "
                f"holds an entry of up to max_frame_bytes - {FRAME_ENVELOPE_BYTES} bytes and its "
                "envelope"
            )


_KIND_NAMES = {int: "an int", float: "a finite number", str: "a str", bool: "a bool"}
_FLOAT_MAX = sys.float_info.max


def _is_kind(value: object, kind: type) -> bool:
    """`value` is of the declared `kind`: a bool is no int here (True would be a count of 1),
    an int is a float (a whole number of seconds), a float is finite."""
    if kind is bool or kind is str:
        return isinstance(value, kind)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, int)
    if isinstance(value, int):  # 10**400 is an int no float can hold: not a number of seconds.
        return abs(value) <= _FLOAT_MAX
    return isinstance(value, float) and math.isfinite(value)


def _field_kinds() -> dict[str, tuple[type, bool]]:
    """(kind, optional) of each ClientConfig field, from its annotation (`float | None`: float,
    optional). Every field is a bool, int, float or str, or one of them | None."""
    kinds: dict[str, tuple[type, bool]] = {}
    for name, hint in typing.get_type_hints(ClientConfig).items():
        members = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
        assert len(members) == 1 and members[0] in _KIND_NAMES, (name, hint)
        kinds[name] = (members[0], members[0] is not hint)
    return kinds


# Also how the Spark options (bkaio/spark/options.py) convert `bkaio.client.<field>` strings.
CONFIG_FIELD_KINDS: Final = _field_kinds()
