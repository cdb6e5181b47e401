"""Conditional writes whose answer may be lost, resolved by reading the key back.

`MetadataStore.compare_and_swap` and a versioned `delete` raise MetadataOutcomeUnknownError
when the store lost the answer of a write that may or may not be applied (now, or later: an
etcd member cut off may forward it when it comes back). Every layer that writes a record
under a version goes through the two functions here, so that each answer the store lost is
decided one way:

- read the key back; our bytes (under our lease, if any) at a newer version than the one the
  write expected mean it landed: its version is returned;
- the key still at the expected version means it has not landed, and since the write is
  conditioned on that version, a late copy can land only while nothing else was written:
  it is sent again, and at most one of the copies lands;
- anything else means another writer won: MetadataVersionError, as if the store had said so.

A version conflict on a copy sent again after a lost answer is read back the same way (the
late first copy may be what beat it). After MAX_METADATA_ATTEMPTS lost answers in a row,
MetadataOutcomeUnknownError again: the last copy may still land, which the caller must
still allow for.

A versioned delete is resolved alike: the key gone means it is deleted (ours, or another's
delete of the same record), and so does a key created anew after the version the delete
expected (its create revision is newer: the record the delete meant is gone).
"""

from __future__ import annotations

import structlog

from bkaio.errors import MetadataVersionError
from bkaio.meta.errors import MetadataOutcomeUnknownError
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, KeyValue, Lease, MetadataStore

log = structlog.get_logger(__name__)


def _gave_up(key: str, step: str) -> MetadataOutcomeUnknownError:
    return MetadataOutcomeUnknownError(
        f"metadata key {key}: gave up after {MAX_METADATA_ATTEMPTS} {step} attempts whose"
        " answers were all lost (the last may still be applied: re-read the key to learn it)"
    )


def _landed(kv: KeyValue | None, value: bytes, expected_version: int, lease: Lease | None) -> bool:
    return (
        kv is not None
        and kv.value == value
        and kv.version > expected_version
        and kv.lease == (0 if lease is None else lease.id)
    )


async def compare_and_swap_resolved(
    store: MetadataStore,
    key: str,
    value: bytes,
    *,
    expected_version: int,
    lease: Lease | None = None,
) -> int:
    """`store.compare_and_swap`, with a lost answer resolved by reading the key back: the new
    version, or MetadataVersionError when another writer won (see the module docstring)."""
    unsure = False
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        try:
            return await store.compare_and_swap(
                key, value, expected_version=expected_version, lease=lease
            )
        except MetadataVersionError:
            if not unsure:
                raise
        except MetadataOutcomeUnknownError as error:
            unsure = True
            log.warning("metadata_write_unconfirmed", key=key, error=str(error))
        current = await store.get(key)
        if _landed(current, value, expected_version, lease):
            assert current is not None
            return current.version
        current_version = 0 if current is None else current.version
        if current_version != expected_version:
            raise MetadataVersionError(
                f"metadata key {key}: version is {current_version}, expected {expected_version}"
            )
    raise _gave_up(key, "compare-and-swap")


async def delete_resolved(store: MetadataStore, key: str, *, expected_version: int | None) -> bool:
    """`store.delete(key, expected_version=...)`, with a lost answer resolved by reading the
    key back: True when the record is gone, False when it was absent at the first try, or
    MetadataVersionError when another writer changed it first (see the module docstring).
    Without `expected_version` the delete is unconditional: the driver retries it whatever
    happened, and there is nothing to resolve."""
    if expected_version is None:
        return await store.delete(key)
    unsure = False
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        try:
            # Absent after a lost answer: that (late) copy, or another's delete, took it.
            return await store.delete(key, expected_version=expected_version) or unsure
        except MetadataVersionError:
            if not unsure:
                raise
        except MetadataOutcomeUnknownError as error:
            unsure = True
            log.warning("metadata_delete_unconfirmed", key=key, error=str(error))
        current = await store.get(key)
        if current is None or current.create_revision > expected_version:
            return True
        if current.version != expected_version:
            raise MetadataVersionError(
                f"metadata key {key}: version is {current.version}, expected {expected_version};"
                " not deleted"
            )
    raise _gave_up(key, "delete")
