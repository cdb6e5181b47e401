"""Framing of the wire protocol v1 (docs/protocol.md, "Framing"): bytes in, msgpack bodies out.

    frame     u32 big-endian body length, then the body: one msgpack array
    request   [op, request_id, *fields]
    response  [op, request_id, status, *fields]

Sans-IO: no sockets, no event loop, no clock. A `FrameDecoder` is fed whatever bytes arrived
and returns every whole body they complete; it refuses an oversized frame as soon as it has
read the length prefix, before it buffers any of the body. Framing cannot resynchronize, so a
`ProtocolError` from a decoder is final: the connection must be closed.

Must not import asyncio, sockets or files; imports only msgpack and bkaio.errors.
"""

from __future__ import annotations

import struct
from typing import Any, NoReturn

import msgpack

# `from bkaio import errors` rather than `from bkaio.errors import ...`: bkaio.errors imports
# bkaio.protocol.status, which runs this package's __init__ first; a module reference stays
# valid while bkaio.errors is still half-initialized, and the names are looked up at call time.
from bkaio import errors

FRAME_HEADER = struct.Struct(">I")
# A 30-byte body [fixint, uint64, fixint, uint64, uint64] in fixed widths, the shape of the
# bookie's ADD_ENTRY OK answer (three per append at the client): read with one struct call.
_FIXED_ANSWER = struct.Struct(">BBBQBBQBQ")
_FIXED_ANSWER_BYTES = _FIXED_ANSWER.size
# Room for a large read response; a longer prefix is a broken or hostile peer.
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024

# The msgpack C unpacker turns malformed input into one of these (truncation, bad UTF-8,
# a reserved type byte, a limit exceeded, nesting too deep, trailing data, a non-str map key).
_UNPACK_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


def _refuse_ext(code: int, data: bytes) -> NoReturn:
    raise errors.ProtocolError(f"msgpack ext type {code} ({len(data)} bytes) is not allowed")


def hardened_unpacker(max_frame_bytes: int) -> msgpack.Unpacker:
    """An Unpacker that accepts only what protocol v1 uses, each length bounded by one frame."""
    assert max_frame_bytes > 0, max_frame_bytes
    return msgpack.Unpacker(
        raw=False,  # str is UTF-8 text; invalid UTF-8 is an error.
        strict_map_key=True,  # No map in v1 anyway; this keeps hostile keys out of dicts.
        use_list=True,
        ext_hook=_refuse_ext,
        max_ext_len=0,  # Also stops the built-in Timestamp ext (type -1), which skips ext_hook.
        max_buffer_size=max_frame_bytes,
        max_bin_len=max_frame_bytes,
        max_str_len=max_frame_bytes,
        # Each element takes at least one byte, so no array or map can hold more than this.
        max_array_len=max_frame_bytes,
        max_map_len=max_frame_bytes,
    )


def frame_parts(body: list[Any]) -> tuple[bytes, bytes]:
    """Header and body kept apart so that `writelines` can send both without joining them."""
    packed: bytes = msgpack.packb(body)
    return FRAME_HEADER.pack(len(packed)), packed


def encode_frame(body: list[Any]) -> bytes:
    """One whole frame as a single bytes object (tests and tools; the hot path batches)."""
    header, packed = frame_parts(body)
    return header + packed


class FrameDecoder:
    """Splits a byte stream into frame bodies. Knows nothing about where the bytes came from."""

    __slots__ = ("_broken", "_buffer", "_fed_bytes", "_max_frame_bytes", "_unpacker")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise errors.ConfigError(f"max_frame_bytes={max_frame_bytes} must be positive")
        self._max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        # One Unpacker reused for every body: building one, or passing the limits to
        # `unpackb`, per frame costs more than the decoding itself.
        self._unpacker = hardened_unpacker(max_frame_bytes)
        # Bytes fed to the unpacker so far: its `tell()` must match after each body.
        self._fed_bytes = 0
        self._broken: errors.ProtocolError | None = None

    @property
    def max_frame_bytes(self) -> int:
        return self._max_frame_bytes

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held until the rest arrives."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[list[Any]]:
        """Every whole body that `data` completes, in order; the rest is kept for the next feed.

        Raises ProtocolError for an oversized length prefix or a body that is not one msgpack
        array; bodies before it in the same feed are dropped with the connection, and every
        later feed raises the same error.
        """
        if self._broken is not None:
            raise self._broken
        buffer = self._buffer
        buffer += data
        buffered = len(buffer)
        header_size = FRAME_HEADER.size
        unpack_header = FRAME_HEADER.unpack_from
        max_frame_bytes = self._max_frame_bytes
        unpacker = self._unpacker
        unpack_fixed_answer = _FIXED_ANSWER.unpack_from
        fed_bytes = self._fed_bytes
        bodies: list[list[Any]] = []
        offset = 0
        try:
            with memoryview(buffer) as view:
                while buffered - offset >= header_size:
                    (body_bytes,) = unpack_header(buffer, offset)
                    if body_bytes > max_frame_bytes:
                        self._fail(
                            f"frame length prefix says {body_bytes} bytes, "
                            f"above max_frame_bytes={max_frame_bytes}"
                        )
                    body_start = offset + header_size
                    body_end = body_start + body_bytes
                    if buffered < body_end:
                        break  # Need more data.
                    if body_bytes == _FIXED_ANSWER_BYTES:
                        array, op, tag1, request_id, status, tag2, ledger_id, tag3, entry_id = (
                            unpack_fixed_answer(buffer, body_start)
                        )
                        # Exactly what msgpack decodes these bytes to: a fixarray of 5, two
                        # positive fixints and three uint64s (0xcf). Any other 30 bytes go on.
                        if (
                            array == 0x95
                            and tag1 == tag2 == tag3 == 0xCF
                            and op < 0x80
                            and status < 0x80
                        ):
                            bodies.append([op, request_id, status, ledger_id, entry_id])
                            offset = body_end
                            continue
                    if body_bytes == 0:
                        self._fail("zero-length frame: a body is one msgpack array")
                    try:
                        unpacker.feed(view[body_start:body_end])
                        value = unpacker.unpack()
                    except _UNPACK_ERRORS as error:
                        self._fail(
                            f"{body_bytes}-byte frame body is not valid msgpack: "
                            f"{type(error).__name__}: {str(error)[:200]}"  # Never echo the body.
                        )
                    except errors.ProtocolError as error:  # From _refuse_ext.
                        self._fail(str(error))
                    fed_bytes += body_bytes
                    if type(value) is not list or unpacker.tell() != fed_bytes:
                        self._reject_body(value, body_bytes, fed_bytes - unpacker.tell())
                    bodies.append(value)
                    offset = body_end
        finally:
            # Compact once per feed, not once per frame; the view is released by now.
            del buffer[:offset]
            self._fed_bytes = fed_bytes
        return bodies

    def _reject_body(self, value: object, body_bytes: int, extra_bytes: int) -> NoReturn:
        if extra_bytes:
            self._fail(
                f"{body_bytes}-byte frame body has {extra_bytes} bytes after its msgpack value"
            )
        type_name = "nil" if value is None else type(value).__name__
        self._fail(f"frame body must be a msgpack array, got {type_name}")

    def _fail(self, message: str) -> NoReturn:
        self._broken = errors.ProtocolError(message)
        raise self._broken


def unpack_body(packed: bytes | memoryview, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Decode one standalone body with the same hardening as `FrameDecoder` (tools and tests)."""
    if len(packed) > max_frame_bytes:
        raise errors.ProtocolError(
            f"{len(packed)}-byte body exceeds max_frame_bytes={max_frame_bytes}"
        )
    decoder = FrameDecoder(max_frame_bytes)
    bodies = decoder.feed(FRAME_HEADER.pack(len(packed)) + bytes(packed))
    assert len(bodies) == 1, len(bodies)
    return bodies[0]
