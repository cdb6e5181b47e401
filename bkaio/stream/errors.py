"""Errors only the stream layer raises, until the lead moves them into `bkaio.errors`.

Each subclasses `BKError` (the argument error, `InvalidArgumentError`), so a caller catching
those keeps working when they move. `QuotaExceededError` already lives in `bkaio.errors` and
is re-exported here for convenience.
"""

from __future__ import annotations

from bkaio.errors import BKError, InvalidArgumentError, QuotaExceededError

__all__ = [
    "InvalidStreamArgumentError",
    "NamespaceDeletingError",
    "NamespaceExistsError",
    "NamespaceNotEmptyError",
    "NamespaceNotFoundError",
    "QuotaExceededError",
    "StreamNotFoundError",
    "StreamSegmentUnreadableError",
    "StreamTruncatedError",
    "TooManyStreamsError",
]


class NamespaceNotFoundError(BKError):
    """The namespace does not exist (and `create` was not asked for)."""


class NamespaceDeletingError(NamespaceNotFoundError):
    """The namespace is being deleted (`delete_namespace` marked it): no stream can be created
    or opened for writing in it. A `NamespaceNotFoundError`, which it is about to be."""


class NamespaceExistsError(BKError):
    """The namespace already exists."""


class NamespaceNotEmptyError(BKError):
    """A namespace that still holds streams cannot be deleted without `force`."""


class StreamNotFoundError(BKError):
    """The stream does not exist in this namespace."""


class TooManyStreamsError(BKError):
    """Creating the stream would exceed the namespace's `max_streams`."""


class StreamTruncatedError(BKError):
    """The position asked for was removed by truncation or retention.

    `first_available` is the first position still readable (None: the stream is empty).
    """

    def __init__(self, message: str, first_available: object = None) -> None:
        super().__init__(message)
        self.first_available = first_available


class StreamSegmentUnreadableError(BKError):
    """A segment of the stream could not be read (its ledger is gone, its bookies are down).

    `segment` is the stream's `Segment` record (ledger id, first and last seq); `__cause__` is
    the ledger client's error.
    """

    def __init__(self, message: str, segment: object = None) -> None:
        super().__init__(message)
        self.segment = segment


class InvalidStreamArgumentError(InvalidArgumentError):
    """A stream call got an argument outside its domain: a bad name (namespace, stream,
    cursor), a start never written, a negative position, a bad roll size.

    An `InvalidArgumentError`, the general bad-argument error, so one `except` catches the
    ledger client's and the stream layer's alike."""
