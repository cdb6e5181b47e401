"""Batched frame encoding: many messages into one reusable buffer, sent with one write.

A connection adds every message it produces during one loop iteration, then takes the batch
and writes it once: one syscall and one buffer for many frames. Sans-IO: no sockets here.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack

from bkaio import errors  # Module reference: see the import note in frames.py.
from bkaio.protocol.frames import DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER

# A msgpack array of up to 15 values starts with one byte, 0x90 | length (fixarray): the
# prepacked path frames [op, request_id, *fields] with at most 13 fields that way.
_MAX_PREPACKED_FIELDS = 13
_FIXARRAY_PREFIXES = tuple(bytes([0x90 | n]) for n in range(16))


class Encodable(Protocol):
    """Any protocol message: every request and response class has `to_body`."""

    def to_body(self) -> list[Any]: ...


class FrameEncoder:
    """Appends frames to one buffer; `take()` returns the batch and starts the next one."""

    __slots__ = ("_buffer", "_frames", "_max_frame_bytes", "_packer")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise errors.ConfigError(f"max_frame_bytes={max_frame_bytes} must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._packer = msgpack.Packer()  # Reused: a Packer per message costs more than packing.
        self._buffer = bytearray()
        self._frames = 0

    def __len__(self) -> int:
        """Bytes waiting in the current batch."""
        return len(self._buffer)

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

        Same bytes as `add([op, request_id, *fields])`; returns the frame size with header.
        """
        assert 0 <= field_count <= _MAX_PREPACKED_FIELDS, field_count
        head = _FIXARRAY_PREFIXES[field_count + 2] + self._packer.pack(op)
        head += self._packer.pack(request_id)
        return self._append(op, head, packed)

    def _append(self, op: int, body: bytes, tail: bytes = b"") -> int:
        """Append the frame whose body is `body + tail`, refusing one above the frame limit."""
        body_bytes = len(body) + len(tail)
        if body_bytes > self._max_frame_bytes:
            raise errors.ProtocolError(
                f"frame of {body_bytes} bytes (op {op}) exceeds "
                f"max_frame_bytes={self._max_frame_bytes}; the peer would refuse it"
            )
        buffer = self._buffer
        buffer += FRAME_HEADER.pack(body_bytes)
        buffer += body
        if tail:
            buffer += tail
        self._frames += 1
        return FRAME_HEADER.size + body_bytes

    def take(self) -> bytes:
        """The batched frames, in the order added; the encoder is empty afterwards."""
        batch = bytes(self._buffer)
        self._buffer.clear()
        self._frames = 0
        return batch

    drain = take
