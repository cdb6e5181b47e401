"""Every error bkaio raises on purpose, and the wire status each one travels as.

Two kinds of failure (STYLE.md section 5): an *operating error* is expected and handled (a dead
bookie, a fenced ledger, a full disk) and is a `BKError`; a *programmer error* is a broken
invariant and is an `assert`. This module imports only `bkaio.status` (a leaf with no imports
of its own, below the protocol), so every package may import it.
"""

from __future__ import annotations

from typing import ClassVar

from bkaio.status import Status


class BKError(Exception):
    """Base of every error bkaio raises on purpose."""

    retriable: ClassVar[bool] = False  # Can the same request succeed later, unchanged?
    status: ClassVar[Status] = Status.INTERNAL_ERROR  # How a bookie reports it on the wire.


class ConfigError(BKError):
    """A configuration value is missing, malformed or out of range."""

    status = Status.BAD_REQUEST


class ProtocolError(BKError):
    """A malformed frame, an unknown operation or an unsupported protocol version."""

    status = Status.BAD_REQUEST


class UnsupportedVersionError(ProtocolError):
    """The peer speaks a protocol version this side does not."""

    status = Status.UNSUPPORTED_VERSION


class LedgerFencedError(BKError):
    """Recovery fenced this ledger; its writer must stop appending."""

    status = Status.FENCED


class LedgerClosedError(BKError):
    """Append to a ledger handle that is closed (sealed)."""

    status = Status.BAD_REQUEST


class NotEnoughBookiesError(BKError):
    """Create or ensemble change cannot find enough writable bookies."""

    status = Status.INTERNAL_ERROR


class NoSuchLedgerError(BKError):
    """The ledger does not exist, or was deleted."""

    status = Status.NO_SUCH_LEDGER


class NoSuchEntryError(BKError):
    """The entry is not there: beyond the end of the ledger, or absent from enough bookies."""

    status = Status.NO_SUCH_ENTRY


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or too few answered to decide."""

    retriable = True
    status = Status.INTERNAL_ERROR


class UnauthorizedError(BKError):
    """Wrong password / master key, or a bad auth token."""

    status = Status.UNAUTHORIZED


class BKTimeoutError(BKError):
    """No quorum answered within the timeout."""

    retriable = True
    status = Status.TIMEOUT


class MetadataVersionError(BKError):
    """A metadata compare-and-swap lost a race."""

    retriable = True
    status = Status.INTERNAL_ERROR


class MetadataError(BKError):
    """The metadata store failed or is unreachable."""

    retriable = True
    status = Status.INTERNAL_ERROR


class ReadOnlyBookieError(BKError):
    """The bookie is read-only (disk full or forced) and refuses adds."""

    retriable = True
    status = Status.READ_ONLY


class TooManyRequestsError(BKError):
    """The bookie is over a request or memory limit; back off and retry."""

    retriable = True
    status = Status.TOO_MANY_REQUESTS


class BookieIOError(BKError):
    """A bookie's storage failed (journal or entry log I/O error)."""

    retriable = True
    status = Status.IO_ERROR


class BookieInternalError(BKError):
    """The bookie hit an unexpected condition while handling the request (a bug, logged there)."""

    status = Status.INTERNAL_ERROR


class WrongShardError(BKError):
    """The request reached a shard that does not own the ledger (route by ledger_id % shards)."""

    status = Status.WRONG_SHARD


class EntryConflictError(BKError):
    """An entry id already stored with a different payload was added again."""

    status = Status.ENTRY_CONFLICT


class BadDigestError(BKError):
    """An entry's CRC32C digest does not match its bytes: a corrupt copy."""

    status = Status.BAD_DIGEST


class DataUnknownError(BKError):
    """The bookie cannot say whether it holds the entry: it lost data (a reformat) and the
    ledger is in limbo until it copied its fragments back. Never evidence of absence."""

    retriable = True
    status = Status.DATA_UNKNOWN


class CookieMismatchError(BKError):
    """A storage directory's cookie does not match the bookie's identity or directory set."""


class InvalidArgumentError(BKError):
    """A call got an argument outside its domain (negative entry id, first > last, bad quorum)."""

    status = Status.BAD_REQUEST


class LedgerRecoveryError(BKError):
    """Recovery could not decide the end of a ledger (too few bookies answered, or they disagreed).

    The ledger stays IN_RECOVERY and unsealed; opening it with recovery again retries.
    """

    retriable = True


class QuotaExceededError(BKError):
    """A write would exceed the namespace's byte quota."""


# One exception class per wire status (DESIGN.md section 3). Exact, closed, and tested: a new
# Status member without a row here fails tests/unit/test_errors.py.
STATUS_ERRORS: dict[Status, type[BKError]] = {
    Status.NO_SUCH_LEDGER: NoSuchLedgerError,
    Status.NO_SUCH_ENTRY: NoSuchEntryError,
    Status.FENCED: LedgerFencedError,
    Status.UNAUTHORIZED: UnauthorizedError,
    Status.BAD_REQUEST: ProtocolError,
    Status.READ_ONLY: ReadOnlyBookieError,
    Status.TOO_MANY_REQUESTS: TooManyRequestsError,
    Status.IO_ERROR: BookieIOError,
    Status.UNSUPPORTED_VERSION: UnsupportedVersionError,
    Status.TIMEOUT: BKTimeoutError,
    Status.WRONG_SHARD: WrongShardError,
    Status.ENTRY_CONFLICT: EntryConflictError,
    Status.BAD_DIGEST: BadDigestError,
    Status.INTERNAL_ERROR: BookieInternalError,
    Status.DATA_UNKNOWN: DataUnknownError,
}


def error_for_status(status: Status, message: str) -> BKError:
    """The exception a client raises for a non-OK status from a bookie."""
    assert status is not Status.OK, "OK is not an error"
    return STATUS_ERRORS[status](message)


def status_for_error(error: BaseException) -> Status:
    """The wire status a bookie answers with when handling a request raised `error`."""
    if isinstance(error, BKError):
        return error.status
    return Status.INTERNAL_ERROR
