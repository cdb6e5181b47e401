"""Errors only the metadata layer raises, until the lead moves them into `bkaio.errors`.

Each one subclasses the nearest class of `bkaio.errors`, so a caller catching `MetadataError`
or `BKError` keeps working when they move.
"""

from __future__ import annotations

from bkaio.errors import BKError, MetadataError


class InvalidMetadataError(BKError):
    """A metadata record breaks an invariant (quorums, ensembles, state) or does not decode."""


class LedgerExistsError(BKError):
    """A ledger with this id already exists in the metadata store."""


class LeaseExpiredError(MetadataError):
    """The lease is gone (expired or revoked): keys bound to it were deleted."""

    retriable = False


class MetadataOutcomeUnknownError(MetadataError):
    """The connection broke while a conditional write was in flight: it may or may not have
    been applied. The caller must re-read the key before deciding what to do."""

    retriable = False


class WatchCompactedError(MetadataError):
    """A watch cannot resume: the changes after its revision were compacted away."""

    retriable = False
