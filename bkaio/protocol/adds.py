"""A bookie's reading of ADD_ENTRY and ADD_ENTRIES bodies: one typed batch of adds for both.

`decode_adds` is the one validation of an add's fields on the bookie: every field's type and
range (the rules of `decode_request`, which words the error when one is broken), then the
bookie's own limit on the payload and the digest. An ADD_ENTRY is a batch of one; entry i of an
ADD_ENTRIES frame is the ADD_ENTRY with request id `request_id + i` (docs/protocol.md, "Batched
adds"). A field of the wrong type or range is a malformed frame (ProtocolError: the connection
answers ERROR and closes); a payload over the limit or a digest that does not match is not: that
add alone is refused (`AddFrame.refused`) and the others of its frame go on.

Hot path: one pass over the fields with inline checks, one `StoredEntry` per add (the record
storage keeps), no message object and no call per field. Sans-IO like the rest of the codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.entries import AddBatch, StoredEntry
from bkaio.protocol.digest import entry_digest
from bkaio.protocol.messages import (
    ADD_ENTRIES_ENTRY_FIELDS,
    ADD_ENTRIES_HEAD_FIELDS,
    FLAG_MASK,
    I64_MAX,
    U32_MAX,
    U64_MAX,
    Flag,
    Op,
    decode_request,
)
from bkaio.status import Status

__all__ = ["ADD_OPS", "AddFrame", "decode_adds"]

# Plain ints: `IntFlag.__and__` and `IntEnum.__eq__` are Python code, `int & int` is not.
_ADD_ENTRY: Final = int(Op.ADD_ENTRY)
_ADD_ENTRIES: Final = int(Op.ADD_ENTRIES)
_RECOVERY_ADD: Final = int(Flag.RECOVERY_ADD)
_HEAD: Final = ADD_ENTRIES_HEAD_FIELDS
_FIELDS: Final = ADD_ENTRIES_ENTRY_FIELDS
# The ops `decode_adds` reads. A tuple: `op in ADD_OPS` compares, and an op of any msgpack type
# (a list, a map) is never hashed.
ADD_OPS: Final = (_ADD_ENTRY, _ADD_ENTRIES)


@dataclass(slots=True, eq=False)
class AddFrame(AddBatch):
    """The adds of one ADD_ENTRY or ADD_ENTRIES frame (or a run of them), checked: a batch for
    ledger storage as it is.

    Add i is `entries[i]`, with request id `request_id + i`. `refused` maps the index of an add
    refused on its own to its status (BAD_REQUEST: payload over the limit; BAD_DIGEST); None
    when every add passed. `coalesce`: it came as ADD_ENTRIES and its entry ids follow each
    other, so its OK answers may be one ADD_ENTRIES answer. The bookie decodes
    into its subclass (`decode_adds`' `frame_type`), which adds what answering takes.
    """

    request_id: int
    coalesce: bool
    payload_bytes: int
    refused: dict[int, Status] | None = None

    def part(self: _Frame, start: int, stop: int) -> _Frame:
        """Adds `start` to `stop` (exclusive) as a frame of their own (request ids kept)."""
        entries = self.entries[start:stop]
        refused = None
        if self.refused:
            refused = {i - start: s for i, s in self.refused.items() if start <= i < stop}
        return type(self)(
            self.ledger_id,
            self.master_key,
            self.recovery,
            entries,
            self.request_id + start,
            self.coalesce,  # A run of a frame whose ids follow each other: so do the run's.
            sum(len(entry.payload) for entry in entries),
            refused or None,
        )


_Frame = TypeVar("_Frame", bound=AddFrame)


def decode_adds(body: list[Any], max_entry_bytes: int, frame_type: type[_Frame]) -> _Frame:
    """The adds of an ADD_ENTRY or ADD_ENTRIES `body` (its op is one of `ADD_OPS`), as a
    `frame_type` (`AddFrame` or a subclass whose extra fields are not `__init__` arguments).

    Raises ProtocolError naming the problem when a field is missing, of the wrong type or out of
    its range. Payloads over `max_entry_bytes` and wrong digests are marked in `refused`.
    """
    op = body[0]
    if op == _ADD_ENTRY:
        if len(body) == 10:
            _, request_id, ledger_id, entry_id, flags, master_key, lac, length, digest, payload = (
                body
            )
            if (
                type(request_id) is int
                and type(ledger_id) is int
                and type(entry_id) is int
                and type(flags) is int
                and type(lac) is int
                and type(length) is int
                and type(digest) is int
                and type(master_key) is bytes
                and type(payload) is bytes
                and 0 <= request_id <= U64_MAX
                and 0 <= ledger_id <= I64_MAX
                and 0 <= entry_id <= I64_MAX
                and 0 <= flags <= FLAG_MASK
                and -1 <= lac <= I64_MAX
                and 0 <= length <= I64_MAX
                and 0 <= digest <= U32_MAX
            ):
                frame = frame_type(
                    ledger_id,
                    master_key,
                    flags & _RECOVERY_ADD != 0,
                    [StoredEntry(ledger_id, entry_id, lac, length, digest, payload)],
                    request_id,
                    False,
                    len(payload),
                )
                if len(payload) > max_entry_bytes:
                    frame.refused = {0: Status.BAD_REQUEST}
                elif entry_digest(ledger_id, entry_id, lac, length, payload) != digest:
                    frame.refused = {0: Status.BAD_DIGEST}
                return frame
    elif op == _ADD_ENTRIES:
        count, extra = divmod(len(body) - _HEAD, _FIELDS)
        request_id = body[1] if len(body) > 1 else None
        ledger_id = body[2] if len(body) > 2 else None
        flags = body[3] if len(body) > 3 else None
        master_key = body[4] if len(body) > 4 else None
        if (
            count >= 1
            and not extra
            and type(request_id) is int
            and type(ledger_id) is int
            and type(flags) is int
            and type(master_key) is bytes
            and request_id >= 0
            and request_id + count - 1 <= U64_MAX
            and 0 <= ledger_id <= I64_MAX
            and 0 <= flags <= FLAG_MASK
        ):
            batch = _entries_of(
                body, request_id, ledger_id, flags, master_key, max_entry_bytes, frame_type
            )
            if batch is not None:
                return batch
    decode_request(body)  # Raises the error that names the broken rule.
    raise errors.ProtocolError(f"op {op!r}: not an add the bookie can read")  # Never reached.


def _entries_of(
    body: list[Any],
    request_id: int,
    ledger_id: int,
    flags: int,
    key: bytes,
    max_bytes: int,
    frame_type: type[_Frame],
) -> _Frame | None:
    """The entries of an ADD_ENTRIES body whose head passed; None when a field is malformed."""
    entries: list[StoredEntry] = []
    refused: dict[int, Status] | None = None
    payload_bytes = 0
    expected = body[_HEAD]
    consecutive = True
    fields = iter(body[_HEAD:])
    for index, (entry_id, lac, length, digest, payload) in enumerate(
        zip(fields, fields, fields, fields, fields, strict=True)
    ):
        if not (
            type(entry_id) is int
            and type(lac) is int
            and type(length) is int
            and type(digest) is int
            and type(payload) is bytes
            and 0 <= entry_id <= I64_MAX
            and -1 <= lac <= I64_MAX
            and 0 <= length <= I64_MAX
            and 0 <= digest <= U32_MAX
        ):
            return None
        if entry_id != expected:
            consecutive = False
        expected = entry_id + 1
        size = len(payload)
        payload_bytes += size
        if size > max_bytes:
            refused = refused or {}
            refused[index] = Status.BAD_REQUEST
        elif entry_digest(ledger_id, entry_id, lac, length, payload) != digest:
            refused = refused or {}
            refused[index] = Status.BAD_DIGEST
        entries.append(StoredEntry(ledger_id, entry_id, lac, length, digest, payload))
    return frame_type(
        ledger_id,
        key,
        flags & _RECOVERY_ADD != 0,
        entries,
        request_id,
        consecutive,
        payload_bytes,
        refused,
    )
