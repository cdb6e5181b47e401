"""Batched frame encoding: many messages into one reusable buffer, sent with one write.

A connection adds every message it produces during one loop iteration, then takes the batch
and writes it once: one syscall and one buffer for many frames. Prepacked frames (the client's
adds) are kept as a list of head and packed-fields buffers instead, that `take_parts` hands to
`writelines` as they are: the fields packed once for several bookies are never copied into a
per-connection buffer. Sans-IO: no sockets here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NoReturn, Protocol

import msgpack

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.protocol.frames import DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER
from bkaio.protocol.messages import (
    ADD_ENTRIES_ENTRY_FIELDS,
    ADD_ENTRIES_HEAD_FIELDS,
    Op,
    ReadEntriesResponse,
)

# A msgpack array of up to 15 values starts with one byte, 0x90 | length (fixarray): the
# prepacked path frames [op, request_id, *fields] with at most 13 fields that way.
_MAX_PREPACKED_FIELDS = 13
_FRAME_HEADER_BYTES = FRAME_HEADER.size
_FIXARRAY_PREFIXES = tuple(bytes([0x90 | n]) for n in range(16))
# The prepacked head in one `struct` call: frame length (u32), fixarray byte, op as a positive
# fixint, then the request id as a msgpack uint32 (0xce) whatever its value. Not always the
# shortest form `Packer.pack` writes, but valid msgpack that every decoder reads as the same
# body. Request ids above 2**32 - 1 or ops above 0x7f are packed the ordinary way.
_PREPACKED_HEAD = struct.Struct(">IBBBI")
_PREPACKED_HEAD_BODY_BYTES = _PREPACKED_HEAD.size - FRAME_HEADER.size  # Counted in the body.
_MSGPACK_UINT32 = 0xCE
_FIXARRAY = 0x90
# `pack_fields(fields) == Packer().pack(fields)[FIXARRAY_HEADER_BYTES:]` for up to 13 fields:
# a hot loop slices itself rather than pay for a Python call per entry (`fields_packer`).
FIXARRAY_HEADER_BYTES = 1
# An ADD_ENTRIES frame's head up to its first entry: frame length (u32), array32 (0xdd) and
# its item count, the op as a positive fixint, the request id as a msgpack uint64 (0xcf); the
# ledger id, flags and master key follow, packed the ordinary way.
_ADD_ENTRIES_HEAD = struct.Struct(">IBIBBQ")
_ADD_ENTRIES_HEAD_BODY_BYTES = _ADD_ENTRIES_HEAD.size - FRAME_HEADER.size
_OP_ADD_ENTRIES = int(Op.ADD_ENTRIES)
assert _OP_ADD_ENTRIES < 0x80  # A positive fixint.
# Entry bytes one ADD_ENTRIES frame collects before the next starts: well inside any sane
# max_frame_bytes of the bookie (which the client does not know), and large enough that a
# frame carries dozens of 1 KiB adds. One larger entry still travels, alone in its frame.
ADD_ENTRIES_BATCH_BYTES = 64 * 1024


def _entries_head(body_bytes: int, count: int, request_id: int, fields: bytes) -> bytes:
    """An ADD_ENTRIES frame up to its first entry; `fields` are its packed ledger id, flags
    and master key."""
    items = ADD_ENTRIES_HEAD_FIELDS + ADD_ENTRIES_ENTRY_FIELDS * count
    head = _ADD_ENTRIES_HEAD.pack(body_bytes, 0xDD, items, _OP_ADD_ENTRIES, 0xCF, request_id)
    return head + fields


def _bin_header(size: int) -> bytes:
    """The msgpack header of a bin of `size` bytes (bin 8, 16 or 32)."""
    if size < 0x100:
        return struct.pack(">BB", 0xC4, size)
    if size < 0x10000:
        return struct.pack(">BH", 0xC5, size)
    return struct.pack(">BI", 0xC6, size)


class Encodable(Protocol):
    """Any protocol message: every request and response class has `to_body`."""

    def to_body(self) -> list[Any]: ...


class FrameEncoder:
    """Appends frames to one buffer; `take()` returns the batch and starts the next one."""

    __slots__ = ("_adds", "_buffer", "_frames", "_max_frame_bytes", "_packer", "_parts")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise errors.ConfigError(f"max_frame_bytes={max_frame_bytes} must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._packer = msgpack.Packer()  # Reused: a Packer per message costs more than packing.
        self._buffer = bytearray()
        # Frames of `add_prepacked` (and `add_read_entries`) as buffers; every one of them
        # precedes the `_buffer` frames.
        self._parts: list[bytes | memoryview] = []
        self._frames = 0
        # The open ADD_ENTRIES frame (`add_to_entries`): [index of its head in `_parts`, first
        # request id, entries, entry bytes, ledger id, flags, master key, entry bytes it may
        # hold]; None when none.
        self._adds: list[Any] | None = None

    def __len__(self) -> int:
        """Bytes waiting in the current batch (an open ADD_ENTRIES head not counted yet)."""
        parts = self._parts  # Summed here, once per batch, rather than counted per frame.
        return len(self._buffer) + (sum(map(len, parts)) if parts else 0)

    @property
    def pending_frames(self) -> int:
        """Frames waiting in the current batch."""
        return self._frames

    def add(self, message: Encodable | list[Any]) -> int:
        """Append one frame (a message or a raw body); returns its size in bytes with header."""
        body = message if isinstance(message, list) else message.to_body()
        return self._append(body[0], self._packer.pack(body))

    @staticmethod
    def fields_packer() -> Callable[[list[Any]], bytes]:
        """A packer's `pack`, for loops that do `pack_fields` inline: pack the list, then drop
        its first FIXARRAY_HEADER_BYTES (at most 13 fields, which the caller guarantees)."""
        return msgpack.Packer().pack  # type: ignore[no-any-return]

    def pack_fields(self, fields: list[Any]) -> bytes:
        """The msgpack encoding of `fields` (at most 13 values) without an array header.

        A request sent to several bookies differs only in its request id: its other fields are
        packed once with this and framed per connection by `add_prepacked`.
        """
        assert len(fields) <= _MAX_PREPACKED_FIELDS, len(fields)
        packed: bytes = self._packer.pack(fields)
        return packed[FIXARRAY_HEADER_BYTES:]

    def add_prepacked(self, op: int, request_id: int, field_count: int, packed: bytes) -> int:
        """Append the frame of `[op, request_id, *fields]` given `pack_fields(fields)`.

        The frame decodes to the same body as `add([op, request_id, *fields])` does (the
        request id is written as a uint32); returns the frame size with header. The hot path
        of every add: the head is one struct pack, and `packed` is kept, not copied.
        """
        assert 0 <= field_count <= _MAX_PREPACKED_FIELDS, field_count
        if not (0 <= request_id <= 0xFFFFFFFF and 0 <= op < 0x80):
            return self._add_prepacked_packer(op, request_id, field_count, packed)
        body_bytes = _PREPACKED_HEAD_BODY_BYTES + len(packed)
        if body_bytes > self._max_frame_bytes:
            self._refuse(op, body_bytes)
        if self._adds is not None:
            self._close_adds()  # Keep the frames in the order they were added.
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        parts.append(
            _PREPACKED_HEAD.pack(
                body_bytes, _FIXARRAY + 2 + field_count, op, _MSGPACK_UINT32, request_id
            )
        )
        parts.append(packed)
        self._frames += 1
        return _FRAME_HEADER_BYTES + body_bytes

    def add_to_entries(
        self, request_id: int, ledger_id: int, flags: int, master_key: bytes, packed_entry: bytes
    ) -> None:
        """Add one add to the open ADD_ENTRIES frame, or open the next one.

        `packed_entry` is `pack_fields([entry_id, lac, length, digest, payload])`, kept, not
        copied (the same bytes go to every bookie). An add joins the open frame when it is of
        the same ledger, flags and key, its request id follows the frame's last one and the
        frame has room (`ADD_ENTRIES_BATCH_BYTES`, less when max_frame_bytes is smaller); each
        entry then has the request id the bookie derives for it. Raises ProtocolError for an
        entry above max_frame_bytes.
        """
        adds = self._adds
        entry_bytes = len(packed_entry)
        if adds is not None:
            count = adds[2]
            if (
                adds[1] + count == request_id
                and adds[4] == ledger_id
                and adds[5] == flags
                and adds[3] + entry_bytes <= adds[7]
                and adds[6] == master_key
            ):
                self._parts.append(packed_entry)
                adds[2] = count + 1
                adds[3] += entry_bytes
                return
            self._close_adds()
        room = self.entries_room(master_key)
        if entry_bytes > room:
            self._refuse(_OP_ADD_ENTRIES, _ADD_ENTRIES_HEAD_BODY_BYTES + entry_bytes)
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        self._adds = [
            len(parts), request_id, 1, entry_bytes, ledger_id, flags, master_key,
            min(room, ADD_ENTRIES_BATCH_BYTES),
        ]  # fmt: skip
        parts.append(b"")  # The frame's head, written when the frame closes.
        parts.append(packed_entry)
        self._frames += 1

    def entries_room(self, master_key: bytes) -> int:
        """Entry bytes an ADD_ENTRIES frame with this key can carry within max_frame_bytes
        (the head's ids and flags counted at their widest)."""
        return self._max_frame_bytes - (_ADD_ENTRIES_HEAD_BODY_BYTES + 9 + 9 + 5 + len(master_key))

    def add_entries_frame(
        self,
        request_id: int,
        ledger_id: int,
        flags: int,
        master_key: bytes,
        packed_entries: list[bytes],
        entry_bytes: int,
    ) -> None:
        """Append one whole ADD_ENTRIES frame: the adds `packed_entries` (as `add_to_entries`
        takes them; `entry_bytes` their total length), request ids from `request_id`.

        The batch path of a ledger handle: the entries are kept, not copied, and the caller
        keeps each frame within `ADD_ENTRIES_BATCH_BYTES` (or one entry alone). Raises
        ProtocolError for a frame above max_frame_bytes, adding nothing.
        """
        packer = self._packer
        fields = packer.pack(ledger_id) + packer.pack(flags) + packer.pack(master_key)
        body_bytes = _ADD_ENTRIES_HEAD_BODY_BYTES + len(fields) + entry_bytes
        if body_bytes > self._max_frame_bytes:
            self._refuse(_OP_ADD_ENTRIES, body_bytes)
        if self._adds is not None:
            self._close_adds()
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        parts.append(_entries_head(body_bytes, len(packed_entries), request_id, fields))
        parts += packed_entries
        self._frames += 1

    def add_read_entries(self, response: ReadEntriesResponse) -> int:
        """Append a READ_ENTRIES response without copying its records: the frame's head (up
        to the bin header of the records field) is packed here, and the record buffers are
        kept as they are, to go to `writelines` (`take_parts`). Returns the frame size."""
        head_fields = [
            response.op,
            response.request_id,
            response.status,
            response.ledger_id,
            response.lac,
            response.next_entry_id,
        ]
        head = self._packer.pack(head_fields)
        assert head[0] == _FIXARRAY | len(head_fields), head[:1]
        records = response.records
        size = sum(len(part) for part in records)
        bin_header = _bin_header(size)
        body_bytes = len(head) + len(bin_header) + size
        if body_bytes > self._max_frame_bytes:
            self._refuse(response.op, body_bytes)
        if self._adds is not None:
            self._close_adds()
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        # The head packed as an array of 6, now of 7 with the records after it.
        parts.append(
            FRAME_HEADER.pack(body_bytes)
            + bytes([_FIXARRAY | (len(head_fields) + 1)])
            + head[1:]
            + bin_header
        )
        parts += records
        self._frames += 1
        return FRAME_HEADER.size + body_bytes

    def _close_adds(self) -> None:
        """Write the head of the open ADD_ENTRIES frame into its place; no frame is open then."""
        adds = self._adds
        assert adds is not None
        self._adds = None
        index, request_id, count, entry_bytes, ledger_id, flags, master_key, _ = adds
        packer = self._packer
        fields = packer.pack(ledger_id) + packer.pack(flags) + packer.pack(master_key)
        body_bytes = _ADD_ENTRIES_HEAD_BODY_BYTES + len(fields) + entry_bytes
        self._parts[index] = _entries_head(body_bytes, count, request_id, fields)

    def _buffer_to_parts(self) -> None:
        buffer = self._buffer
        self._parts.append(bytes(buffer))
        buffer.clear()

    def _add_prepacked_packer(
        self, op: int, request_id: int, field_count: int, packed: bytes
    ) -> int:
        """`add_prepacked` for an op or request id outside the struct head's ranges."""
        head = _FIXARRAY_PREFIXES[field_count + 2] + self._packer.pack(op)
        head += self._packer.pack(request_id)
        return self._append(op, head, packed)

    def _refuse(self, op: int, body_bytes: int) -> NoReturn:
        raise errors.ProtocolError(
            f"frame of {body_bytes} bytes (op {op}) exceeds "
            f"max_frame_bytes={self._max_frame_bytes}; the peer would refuse it"
        )

    def _append(self, op: int, body: bytes, tail: bytes = b"") -> int:
        """Append the frame whose body is `body + tail`, refusing one above the frame limit."""
        body_bytes = len(body) + len(tail)
        if body_bytes > self._max_frame_bytes:
            self._refuse(op, body_bytes)
        if self._adds is not None:
            self._close_adds()  # Keep the frames in the order they were added.
        buffer = self._buffer
        buffer += FRAME_HEADER.pack(body_bytes)
        buffer += body
        if tail:
            buffer += tail
        self._frames += 1
        return FRAME_HEADER.size + body_bytes

    def take(self) -> bytes:
        """The batched frames, in the order added; the encoder is empty afterwards."""
        if self._parts or self._adds is not None:
            return b"".join(self.take_parts())
        batch = bytes(self._buffer)
        self._buffer.clear()
        self._frames = 0
        return batch

    def take_parts(self) -> list[bytes | memoryview]:
        """`take` as a list of buffers whose concatenation is the batch, for `writelines`."""
        if self._adds is not None:
            self._close_adds()
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        self._parts = []
        self._frames = 0
        return parts

    drain = take
