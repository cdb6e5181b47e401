"""Errors the journal raises on purpose, beyond those in `bkaio.errors`.

Defined here, in the journal's own package, until the lead decides whether they belong in
`bkaio.errors`. Each is a `BKError`, so a bookie maps it to a wire status like any other.
"""

from __future__ import annotations

from bkaio.errors import BKError, TooManyRequestsError
from bkaio.status import Status


class JournalError(BKError):
    """The journal cannot do what was asked: it is closed, failed, or its files are unusable."""

    status = Status.IO_ERROR


class JournalFormatError(JournalError):
    """Bytes on disk are not a journal this version can read (wrong magic, version or file id)."""


class RecordError(JournalError):
    """A journal record could not be decoded."""


class TruncatedRecordError(RecordError):
    """The buffer ends before the record does: a torn write, or more bytes are needed."""


class CorruptRecordError(RecordError):
    """The record's bytes are all there but wrong: a bad checksum, length, kind or body."""


class JournalFullError(TooManyRequestsError):
    """The next group commit is at its byte or entry bound; wait for room and append again."""
