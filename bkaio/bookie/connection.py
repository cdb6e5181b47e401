"""One client connection to a bookie shard: an `asyncio.Protocol` over the sans-IO codec.

Bytes go to `FrameDecoder`; whole bodies become requests (`decode_request`) handed to the shard's
`ShardServer`. Responses produced during one loop iteration are encoded into one buffer and sent
with one `transport.write` (a flush scheduled with `call_soon`). Backpressure: past
`max_inflight_per_connection` requests in flight, past the shard's memory bound, or while the
transport's write buffer is above its high-water mark, the connection stops reading the socket.

HELLO must come first (anything else: BAD_REQUEST, close; another version: UNSUPPORTED_VERSION,
close). A frame or body that cannot be decoded gets one ERROR response with BAD_REQUEST and the
connection is closed (framing cannot resynchronize); other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Any, cast

import structlog

from bkaio.errors import ProtocolError
from bkaio.protocol.encoder import FrameEncoder
from bkaio.protocol.frames import FrameDecoder
from bkaio.protocol.messages import ErrorResponse, HelloRequest, decode_request, request_id_of
from bkaio.protocol.status import Status

if TYPE_CHECKING:
    from bkaio.protocol.messages import Response

    from .server import ShardServer

log = structlog.get_logger(__name__)


class BookieServerProtocol(asyncio.Protocol):
    """Server side of one connection. All methods run on the shard's event loop."""

    def __init__(self, server: ShardServer) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(server.limits.max_frame_bytes)
        self._encoder = FrameEncoder(server.limits.max_frame_bytes)
        self._flush_scheduled = False
        self._hello_done = False
        self._closing = False
        self._close_after_flush = False
        self._inflight = 0
        self._reading_paused = False
        self._write_paused = False
        self._memory_paused = False
        self._stopped_reading = False
        self.long_polls: set[asyncio.Task[None]] = set()
        self.peer = "?"
        now = self._loop.time()
        self._opened_at = now
        self._last_activity = now
        self._partial_since: float | None = None

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass but has its interface.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self._server
        server.metrics.connections_accepted.inc()
        if len(server.connections) >= server.limits.max_connections or server.stopping:
            reason = "stopping" if server.stopping else "max_connections"
            server.metrics.connections_closed.labels(reason=reason).inc()
            transport.abort()
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._server.connections.discard(self)
        self._server.memory_paused.discard(self)
        for task in list(self.long_polls):
            task.cancel()  # Nobody is left to answer; adds in flight still finish (durability).
        self._transport = None

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        now = self._loop.time()
        self._last_activity = now
        try:
            bodies = self._decoder.feed(data)
        except ProtocolError as error:
            self._fail(0, str(error))
            return
        if self._decoder.buffered_bytes == 0:
            self._partial_since = None
        elif bodies or self._partial_since is None:
            self._partial_since = now  # A frame started (or completed and another started).
        server = self._server
        for body in bodies:
            if self._closing or self._close_after_flush:
                return
            self._handle_body(server, body)

    def eof_received(self) -> bool | None:
        # The client finished sending: answer what is in flight, then close (return True keeps
        # the write side open until we close it).
        if self._inflight == 0:
            self.close_after_flush()
            return True
        self._close_after_flush_when_idle = True
        return True

    # --- requests ----------------------------------------------------------------------------

    def _handle_body(self, server: ShardServer, body: list[Any]) -> None:
        try:
            request = decode_request(body)
        except ProtocolError as error:
            self._fail(request_id_of(body), str(error))
            return
        if self._hello_done:
            server.dispatch(self, request)
            return
        if not isinstance(request, HelloRequest):
            server.metrics.protocol_errors.inc()
            self.respond(request.error_response(Status.BAD_REQUEST))
            self.close_after_flush()
            log.info("connection_without_hello", peer=self.peer, op=request.op.name)
            return
        response, accepted = server.hello(request)
        self.respond(response)
        if accepted:
            self._hello_done = True
        else:
            self.close_after_flush()
            log.info("hello_refused", peer=self.peer, status=response.status.name)

    def _fail(self, request_id: int, message: str) -> None:
        """A malformed frame: one ERROR response, then close (framing cannot resynchronize)."""
        self._server.metrics.protocol_errors.inc()
        self._server.metrics.connections_closed.labels(reason="protocol_error").inc()
        log.info("protocol_error", peer=self.peer, request_id=request_id, error=message[:200])
        self.respond(ErrorResponse(request_id, Status.BAD_REQUEST, message[:1000]))
        self.close_after_flush()

    def respond(self, response: Response) -> None:
        """Queue `response`; everything queued in this loop iteration goes out in one write."""
        if self._transport is None or self._closing:
            return
        try:
            self._encoder.add(response)
        except ProtocolError as error:  # A response above max_frame_bytes: a server bug or
            # limits set inconsistently; the client still gets an answer for its request id.
            log.error("response_too_large", peer=self.peer, error=str(error))
            self._encoder.add(
                ErrorResponse(response.request_id, Status.INTERNAL_ERROR, "response too large")
            )
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if len(self._encoder):
            transport.write(self._encoder.take())
        if self._close_after_flush:
            self._closing = True
            transport.close()

    # --- flow control ------------------------------------------------------------------------

    def request_started(self, size: int) -> None:
        self._inflight += 1
        if self._inflight >= self._server.limits.max_inflight_per_connection:
            self._update_reading()

    def request_finished(self, size: int) -> None:
        self._inflight -= 1
        if self._reading_paused:
            self._update_reading()
        if self._inflight == 0 and getattr(self, "_close_after_flush_when_idle", False):
            self.close_after_flush()

    def pause_for_memory(self) -> None:
        self._memory_paused = True
        self._update_reading()

    def resume_after_memory(self) -> None:
        self._memory_paused = False
        self._update_reading()

    def stop_reading(self) -> None:
        """Shutdown: read no more requests; the ones in flight are still answered."""
        self._stopped_reading = True
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        limit = self._server.limits.max_inflight_per_connection
        over_limit = self._inflight >= limit or (
            self._reading_paused and self._inflight > limit // 2
        )
        pause = over_limit or self._write_paused or self._memory_paused or self._stopped_reading
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()

    def close_after_flush(self) -> None:
        """Close once the queued responses are written."""
        self._close_after_flush = True
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def check_deadlines(
        self, now: float, *, hello_timeout: float, frame_timeout: float, idle_timeout: float
    ) -> None:
        """Close a connection that never said HELLO, stalls mid-frame, or sits idle too long."""
        transport = self._transport
        if transport is None or self._closing:
            return
        reason = ""
        if not self._hello_done and now - self._opened_at > hello_timeout:
            reason = "hello_timeout"
        elif self._partial_since is not None and now - self._partial_since > frame_timeout:
            reason = "frame_read_timeout"
        elif self._inflight == 0 and now - self._last_activity > idle_timeout:
            reason = "idle_timeout"
        if reason:
            self._server.metrics.connections_closed.labels(reason=reason).inc()
            log.info("connection_timed_out", peer=self.peer, reason=reason)
            self._closing = True
            transport.abort()
