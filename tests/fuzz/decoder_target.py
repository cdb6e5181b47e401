"""The decoder property every fuzzer checks: bytes in, typed requests or ProtocolError out.

`one_input(data)` splits `data` into a chunking pattern and a byte stream, feeds the stream to a
`FrameDecoder` in those chunks, and decodes each body as a request and as a response. Anything
other than a well-typed message or `bkaio.errors.ProtocolError` (an IndexError, a TypeError, a
bare msgpack exception, a crash) is a bug. Shared by the atheris target (fuzz_decoder.py) and the
hypothesis fallback (test_fuzz_decoder.py).
"""

from __future__ import annotations

from bkaio.errors import ProtocolError
from bkaio.protocol.frames import FrameDecoder
from bkaio.protocol.messages import (
    Request,
    Response,
    decode_request,
    decode_response,
    request_id_of,
)

MAX_FRAME_BYTES = 64 * 1024  # Small, so that oversized prefixes are common.


def _chunks(pattern: bytes, stream: bytes) -> list[bytes]:
    """Cut `stream` where `pattern` says (each byte a chunk length, 0 = the rest)."""
    chunks: list[bytes] = []
    offset = 0
    for size in pattern:
        if offset >= len(stream):
            break
        end = len(stream) if size == 0 else offset + size
        chunks.append(stream[offset:end])
        offset = end
    if offset < len(stream):
        chunks.append(stream[offset:])
    return chunks


def one_input(data: bytes) -> None:
    """Raise AssertionError (or anything but ProtocolError) when the decoder misbehaves."""
    pattern_bytes = data[0] % 8 if data else 0
    pattern, stream = data[1 : 1 + pattern_bytes], data[1 + pattern_bytes :]
    decoder = FrameDecoder(MAX_FRAME_BYTES)
    for chunk in _chunks(pattern, stream):
        try:
            bodies = decoder.feed(chunk)
        except ProtocolError:
            assert decoder.buffered_bytes <= len(stream)
            try:
                decoder.feed(b"")
            except ProtocolError:
                return  # A broken decoder stays broken.
            raise AssertionError("a decoder that raised accepted more input") from None
        assert decoder.buffered_bytes <= MAX_FRAME_BYTES + 4
        for body in bodies:
            assert type(body) is list, type(body)
            request_id = request_id_of(body)
            assert isinstance(request_id, int) and request_id >= 0, request_id
            try:
                request = decode_request(body)
            except ProtocolError:
                pass
            else:
                assert isinstance(request, Request), request
                assert request.to_body() == body, (request, body)  # Decoding loses nothing.
            try:
                response = decode_response(body)
            except ProtocolError:
                pass
            else:
                assert isinstance(response, Response), response
