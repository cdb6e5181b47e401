"""Field checks of the codec's decoders (`bkaio.protocol.messages`): one per kind of field.

A check returns the field's value (converted where the message holds a richer type) or raises
`_FieldError` with the problem; the decoder adds the operation and the field's name.
Pure Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from bkaio.protocol.codes import _FLAGS, _STATUSES, FLAG_MASK, I64_MAX, U32_MAX, U64_MAX, Flag
from bkaio.protocol.message_types import WireEntry
from bkaio.status import Status


class _FieldError(Exception):
    """Internal: one field failed its check. Never leaves the codec's decoders."""


Check = Callable[[Any], Any]


def _type_name(value: object) -> str:
    return "nil" if value is None else type(value).__name__


def _int_text(value: int) -> str:
    """An int for an error message; a huge one (only possible off the wire) by its size."""
    return str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit int"


def _int_between(low: int, high: int) -> Check:
    def check(value: Any) -> int:
        if type(value) is not int:  # Exactly int: a bool is an int to isinstance, not to us.
            raise _FieldError(f"must be int, got {_type_name(value)}")
        if not low <= value <= high:
            raise _FieldError(f"must be in [{low}, {high}], got {_int_text(value)}")
        return value

    return check


_check_request_id = _int_between(0, U64_MAX)
_check_ledger_id = _int_between(0, I64_MAX)
_check_entry_id = _int_between(0, I64_MAX)
_check_entry_id_or_last = _int_between(-1, I64_MAX)  # -1 = the last entry stored / none.
_check_lac = _int_between(-1, I64_MAX)  # -1 = nothing confirmed yet.
_check_count = _int_between(0, I64_MAX)  # Lengths, limits and byte counts.
_check_digest = _int_between(0, U32_MAX)
_check_u32 = _int_between(0, U32_MAX)


def _check_flags(value: Any) -> Flag:
    if type(value) is not int:
        raise _FieldError(f"must be int, got {_type_name(value)}")
    if not 0 <= value <= FLAG_MASK:
        raise _FieldError(
            f"must be a combination of Flag bits (mask {FLAG_MASK}), got {_int_text(value)}"
        )
    return _FLAGS[value]


def _check_status(value: Any) -> Status:
    if type(value) is not int:
        raise _FieldError(f"must be int, got {_type_name(value)}")
    if not 0 <= value < len(_STATUSES):
        raise _FieldError(f"is not a known Status, got {_int_text(value)}")
    return _STATUSES[value]


def _check_bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise _FieldError(f"must be bytes, got {_type_name(value)}")
    return value


def _check_bytes_or_nil(value: Any) -> bytes | None:
    if value is not None and type(value) is not bytes:
        raise _FieldError(f"must be bytes or nil, got {_type_name(value)}")
    return value


def _check_str(value: Any) -> str:
    if type(value) is not str:
        raise _FieldError(f"must be str, got {_type_name(value)}")
    return value


def _check_str_or_nil(value: Any) -> str | None:
    if value is not None and type(value) is not str:
        raise _FieldError(f"must be str or nil, got {_type_name(value)}")
    return value


def _check_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise _FieldError(f"must be bool, got {_type_name(value)}")
    return value


def _check_list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise _FieldError(f"must be an array, got {_type_name(value)}")
    return value


def _check_str_list(value: Any) -> tuple[str, ...]:
    for index, item in enumerate(_check_list(value)):
        if type(item) is not str:
            raise _FieldError(f"item {index} must be str, got {_type_name(item)}")
    return tuple(value)


def _check_items(
    value: Any, index: int, names: Sequence[str], checks: Sequence[Check]
) -> list[Any]:
    """Check one array item of a fixed shape (a nested entry or range)."""
    if type(value) is not list:
        raise _FieldError(f"item {index} must be an array, got {_type_name(value)}")
    if len(value) != len(names):
        raise _FieldError(
            f"item {index} has {len(value)} fields, expected {len(names)} ({', '.join(names)})"
        )
    checked = []
    for position, (name, check, item) in enumerate(zip(names, checks, value, strict=True)):
        try:
            checked.append(check(item))
        except _FieldError as error:
            raise _FieldError(f"item {index} field {position} ({name}) {error}") from None
    return checked


_RANGE_NAMES = ("first", "last")
_RANGE_CHECKS = (_check_entry_id, _check_entry_id)


def _check_ranges(value: Any) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    previous_last = -1
    for index, item in enumerate(_check_list(value)):
        first, last = _check_items(item, index, _RANGE_NAMES, _RANGE_CHECKS)
        if first > last:
            raise _FieldError(f"item {index} has first {first} above last {last}")
        if first <= previous_last:
            raise _FieldError(f"item {index} starts at {first}, not after {previous_last}")
        ranges.append((first, last))
        previous_last = last
    return tuple(ranges)


_ENTRY_NAMES = ("lac", "length", "digest", "payload")
_ENTRY_CHECKS = (_check_lac, _check_count, _check_digest, _check_bytes)


def _check_entry_or_nil(value: Any) -> tuple[int, int, int, bytes] | None:
    if value is None:
        return None
    if type(value) is not list:
        raise _FieldError(f"must be an array or nil, got {_type_name(value)}")
    lac, length, digest, payload = _check_items(value, 0, _ENTRY_NAMES, _ENTRY_CHECKS)
    return lac, length, digest, payload


_RANGE_ENTRY_NAMES = ("entry_id", *_ENTRY_NAMES)
_RANGE_ENTRY_CHECKS = (_check_entry_id, *_ENTRY_CHECKS)


def _check_entries(value: Any) -> tuple[WireEntry, ...]:
    entries: list[WireEntry] = []
    for index, item in enumerate(_check_list(value)):
        entry_id, lac, length, digest, payload = _check_items(
            item, index, _RANGE_ENTRY_NAMES, _RANGE_ENTRY_CHECKS
        )
        if entries and entry_id != entries[-1].entry_id + 1:
            raise _FieldError(
                f"item {index} has entry_id {entry_id}, expected {entries[-1].entry_id + 1}"
            )
        entries.append(WireEntry(entry_id, lac, length, digest, payload))
    return tuple(entries)
