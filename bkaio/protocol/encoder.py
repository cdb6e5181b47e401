"""Batched frame encoding: many messages into one reusable buffer, sent with one write.

A connection adds every message it produces during one loop iteration, then takes the batch
and writes it once: one syscall and one buffer for many frames. Prepacked frames (the client's
adds) are kept as a list of head and packed-fields buffers instead, that `take_parts` hands to
`writelines` as they are: the fields packed once for several bookies are never copied into a
per-connection buffer. Sans-IO: no sockets here.
"""

from __future__ import annotations

import struct
from typing import Any, NoReturn, Protocol

import msgpack

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.protocol.frames import DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER

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


class Encodable(Protocol):
    """Any protocol message: every request and response class has `to_body`."""

    def to_body(self) -> list[Any]: ...


class FrameEncoder:
    """Appends frames to one buffer; `take()` returns the batch and starts the next one."""

    __slots__ = ("_buffer", "_frames", "_max_frame_bytes", "_packer", "_parts")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise errors.ConfigError(f"max_frame_bytes={max_frame_bytes} must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._packer = msgpack.Packer()  # Reused: a Packer per message costs more than packing.
        self._buffer = bytearray()
        # Frames of `add_prepacked` as buffers; every one of them precedes the `_buffer` frames.
        self._parts: list[bytes] = []
        self._frames = 0

    def __len__(self) -> int:
        """Bytes waiting in the current batch."""
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

    def pack_fields(self, fields: list[Any]) -> bytes:
        """The msgpack encoding of `fields` (at most 13 values) without an array header.

        A request sent to several bookies differs only in its request id: its other fields are
        packed once with this and framed per connection by `add_prepacked`.
        """
        assert len(fields) <= _MAX_PREPACKED_FIELDS, len(fields)
        packed: bytes = self._packer.pack(fields)
        return packed[1:]  # Drop the one-byte fixarray header.

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
        if self._buffer:
            self._buffer_to_parts()  # Keep the frames in the order they were added.
        parts = self._parts
        parts.append(
            _PREPACKED_HEAD.pack(
                body_bytes, _FIXARRAY + 2 + field_count, op, _MSGPACK_UINT32, request_id
            )
        )
        parts.append(packed)
        self._frames += 1
        return _FRAME_HEADER_BYTES + body_bytes

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
        buffer = self._buffer
        buffer += FRAME_HEADER.pack(body_bytes)
        buffer += body
        if tail:
            buffer += tail
        self._frames += 1
        return FRAME_HEADER.size + body_bytes

    def take(self) -> bytes:
        """The batched frames, in the order added; the encoder is empty afterwards."""
        if self._parts:
            return b"".join(self.take_parts())
        batch = bytes(self._buffer)
        self._buffer.clear()
        self._frames = 0
        return batch

    def take_parts(self) -> list[bytes]:
        """`take` as a list of buffers whose concatenation is the batch, for `writelines`."""
        if self._buffer:
            self._buffer_to_parts()
        parts = self._parts
        self._parts = []
        self._frames = 0
        return parts

    drain = take
