"""One client connection to a bookie shard: an `asyncio.Protocol` over the sans-IO codec.

Bytes go to `FrameDecoder`. ADD_ENTRY and ADD_ENTRIES bodies become checked `AddRequests`
(`decode_adds`) handed to the shard's one add path (`RequestHandler.add`); other bodies become
requests (`decode_request`) handed to `RequestHandler.dispatch`. The connection knows the
request handling only through `RequestHandler` (bkaio/bookie/interfaces.py), and is known by it
only as a `Peer`. Responses produced during one loop iteration are encoded into one buffer and
sent with one `transport.write` (a flush scheduled with `call_soon`); OK answers of adds that
continue each other (ADD_ENTRIES frames) leave as one ADD_ENTRIES answer. Backpressure: past
`max_inflight_per_connection` requests in flight (a frame of adds is split at the cap), past the
shard's memory bound, while the shard's write cache is full, or while the transport's write
buffer is above its high-water mark, the connection stops reading the socket; reads already
taken wait for room before they read (bkaio/bookie/read_memory.py: `writing_paused`,
`unsent_bytes`, `writing_resumed`).

HELLO must come first (anything else: BAD_REQUEST, close; another version: UNSUPPORTED_VERSION,
close). A frame or body that cannot be decoded gets one ERROR response with BAD_REQUEST and the
connection is closed (framing cannot resynchronize); other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
from collections import deque
from typing import Any, cast

import structlog

from bkaio.errors import ProtocolError
from bkaio.protocol.adds import ADD_OPS, decode_adds
from bkaio.protocol.encoder import FrameEncoder
from bkaio.protocol.frames import FrameDecoder
from bkaio.protocol.messages import (
    ErrorResponse,
    HelloRequest,
    Op,
    ReadEntriesResponse,
    Response,
    decode_request,
    request_id_of,
)
from bkaio.status import Status

from .interfaces import AddRequests, RequestHandler

log = structlog.get_logger(__name__)

_OP_ADD_ENTRY = int(Op.ADD_ENTRY)
_STATUS_OK = int(Status.OK)
# An ADD_ENTRY OK answer, [op, request_id, status, ledger_id, entry_id], framed in one struct:
# fixarray of 5, op and status as positive fixints, the three ids as msgpack uint64 (0xcf).
# Fixed widths are valid msgpack; any decoder reads them like the shortest encoding.
_ADD_OK_FRAME = struct.Struct(">IBBBQBBQBQ")
_ADD_OK_BODY_BYTES = _ADD_OK_FRAME.size - 4
# The coalesced OK answer, [op, request_id, status, ledger_id, entry_id, count], the same way.
_ADDS_OK_FRAME = struct.Struct(">IBBBQBBQBQBQ")
_ADDS_OK_BODY_BYTES = _ADDS_OK_FRAME.size - 4
_OP_ADD_ENTRIES = int(Op.ADD_ENTRIES)
assert _OP_ADD_ENTRY < 0x80 and _OP_ADD_ENTRIES < 0x80 and _STATUS_OK < 0x80  # Fixints.


class BookieServerProtocol(asyncio.Protocol):
    """Server side of one connection. All methods run on the shard's event loop."""

    def __init__(self, server: RequestHandler) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(server.limits.max_frame_bytes)
        self._encoder = FrameEncoder(server.limits.max_frame_bytes)
        self._add_oks = bytearray()  # ADD_ENTRY OK frames (`respond_add_ok`), sent with the rest.
        # The coalesced OK answer being extended (`respond_adds_ok`): first request id, ledger
        # id, first entry id, count (0: none).
        self._run_request_id = 0
        self._run_ledger_id = 0
        self._run_entry_id = 0
        self._run_count = 0
        self._flush_scheduled = False
        self._hello_done = False
        self._closing = False
        self._close_after_flush = False
        self._inflight = 0
        self._reading_paused = False
        self._write_paused = False
        self._memory_paused = False
        self._room_paused = False  # The shard's write cache is full (`ShardServer`).
        self._stopped_reading = False
        self._long_polls: set[asyncio.Task[None]] = set()
        self.inflight_ids: set[int] = set()  # Request ids being executed (duplicates refused).
        # Decoded bodies (and the rest of an add frame split at the in-flight cap) held back
        # while reading is paused: one read can carry thousands of small requests, and
        # answering them all at once would defeat the in-flight cap.
        self._backlog: deque[list[Any] | AddRequests] = deque()
        self._close_after_flush_when_idle = False  # EOF seen: close once everything is answered.
        self._refused = False  # HELLO refused: the answer is held back, nothing else is read.
        self._refusal_timer: asyncio.TimerHandle | None = None
        self.peer = "?"
        self._peer_host = "?"
        now = self._loop.time()
        self._opened_at = now
        self._last_activity = now
        self._partial_since: float | None = None
        self._closing_since: float | None = None  # When `close()` began waiting for the flush.

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass but has its interface.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._peer_host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server = self._server
        server.metrics.connections_accepted.inc()
        # Responses a client does not read pile up here; past the mark reading stops.
        high = server.limits.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        refused = server.open_connection(self)
        if refused is not None:
            server.metrics.connections_closed.labels(reason=refused).inc()
            self._transport = None
            transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._server.close_connection(self)
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
            self._refusal_timer = None
        for task in list(self._long_polls):
            task.cancel()  # Nobody is left to answer; adds in flight still finish (durability).
        self._transport = None

    def pause_writing(self) -> None:
        self._server.metrics.limit_hit("write_buffer_high_bytes")
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()
        self._server.writing_resumed(self)  # Reads waiting for room to answer go on.

    def data_received(self, data: bytes) -> None:
        if self._closing or self._refused:
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
        if self._backlog:
            self._backlog.extend(bodies)
            return
        self._take_bodies(bodies)

    def _take_bodies(self, bodies: list[list[Any]] | deque[list[Any] | AddRequests]) -> None:
        """Execute `bodies` in order until reading pauses; the rest go to the backlog."""
        server = self._server
        backlog = self._backlog
        limits = server.limits
        max_entry_bytes = limits.max_entry_bytes
        max_inflight = limits.max_inflight_per_connection
        for index, body in enumerate(bodies):
            if self._closing or self._close_after_flush or self._refused:
                return
            if self._reading_paused:
                backlog.extend(itertools.islice(bodies, index, None))
                return
            if type(body) is list:
                if not (body and body[0] in ADD_OPS and self._hello_done):
                    self._handle_body(server, body)
                    continue
                try:
                    frame = decode_adds(body, max_entry_bytes, AddRequests)
                except ProtocolError as error:
                    self._fail(request_id_of(body), str(error))
                    return
            else:  # The rest of a frame split at the in-flight cap.
                frame = cast(AddRequests, body)
            if len(frame.entries) < max_inflight - self._inflight:
                server.add(self, frame)  # The common case: it fits under the cap.
                continue
            # Past the in-flight cap only the first adds of a frame are taken; the rest wait
            # in the backlog, ahead of the bodies after it, until reading resumes.
            while True:
                room = max_inflight - self._inflight
                count = len(frame.entries)
                if count <= room or room <= 0:
                    server.add(self, frame)
                    break
                server.add(self, frame.part(0, room))
                frame = frame.part(room, count)
                if self._reading_paused or self._closing or self._close_after_flush:
                    backlog.append(frame)
                    backlog.extend(itertools.islice(bodies, index + 1, None))
                    return

    def _drain_backlog(self) -> None:
        """Handle held-back bodies until none are left or reading pauses again."""
        # The backlog's bodies take the same paths as freshly read ones (the fast add paths
        # above all: a bookie that fell behind must not get slower per add as it catches up).
        backlog, self._backlog = self._backlog, deque()
        self._take_bodies(backlog)
        if self._closing or self._close_after_flush or self._refused:
            self._backlog.clear()
            return
        backlog = self._backlog
        if not backlog and self._inflight == 0 and self._close_after_flush_when_idle:
            self.close_after_flush()

    def eof_received(self) -> bool | None:
        # The client finished sending: answer what is in flight, then close (return True keeps
        # the write side open until we close it).
        if self._inflight == 0 and not self._backlog:
            self.close_after_flush()
            return True
        self._close_after_flush_when_idle = True
        return True

    # --- requests ----------------------------------------------------------------------------

    def _handle_body(self, server: RequestHandler, body: list[Any]) -> None:
        try:
            request = decode_request(body)
        except ProtocolError as error:
            self._fail(request_id_of(body), str(error))
            return
        if self._hello_done:
            server.dispatch(self, request)  # Never an add: those go to `_take_bodies`' path.
            return
        if not isinstance(request, HelloRequest):
            server.metrics.protocol_errors.inc()
            self.respond(request.error_response(Status.BAD_REQUEST))
            self.close_after_flush()
            log.info("connection_without_hello", peer=self.peer, op=request.op.name)
            return
        response, accepted = server.hello(request)
        if accepted:
            self.respond(response)
            self._hello_done = True
            return
        log.info("hello_refused", peer=self.peer, status=response.status.name)  # No token.
        if response.status is not Status.UNAUTHORIZED:
            self.respond(response)
            self.close_after_flush()
            return
        # A wrong token: read nothing more, answer after a delay that grows with the host's
        # recent failures (token guessing gets slow), then close.
        self._refused = True
        if self._transport is not None:
            self._transport.pause_reading()
        delay = server.refusal_delay(self._peer_host, self._loop.time())
        self._refusal_timer = self._loop.call_later(delay, self._send_refusal, response)

    def _send_refusal(self, response: Response) -> None:
        self._refusal_timer = None
        self.respond(response)
        self.close_after_flush()

    def _fail(self, request_id: int, message: str) -> None:
        """A malformed frame: one ERROR response, then close (framing cannot resynchronize)."""
        if "above max_frame_bytes" in message:
            self._server.metrics.limit_hit("max_frame_bytes")
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
            if type(response) is ReadEntriesResponse:
                self._encoder.add_read_entries(response)  # The records are not copied.
            else:
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

    def respond_add_ok(self, request_id: int, ledger_id: int, entry_id: int) -> None:
        """Queue the OK answer to an ADD_ENTRY: one fixed-size frame packed by one C call."""
        if self._transport is None or self._closing:
            return
        self._add_oks += _ADD_OK_FRAME.pack(
            _ADD_OK_BODY_BYTES, 0x95, _OP_ADD_ENTRY, 0xCF, request_id, _STATUS_OK,
            0xCF, ledger_id, 0xCF, entry_id,
        )  # fmt: skip
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def respond_adds_ok(self, request_id: int, ledger_id: int, entry_id: int, count: int) -> None:
        """Queue OK answers for `count` adds of ADD_ENTRIES frames (request ids and entry ids
        consecutive from the given ones). Answers that continue the one queued before are
        joined to it: one ADD_ENTRIES answer for the run; one add alone gets the ADD_ENTRY
        answer."""
        if self._transport is None or self._closing:
            return
        run = self._run_count
        if run:
            if (
                request_id == self._run_request_id + run
                and entry_id == self._run_entry_id + run
                and ledger_id == self._run_ledger_id
            ):
                self._run_count = run + count
                return
            self._queue_run()
        self._run_request_id = request_id
        self._run_ledger_id = ledger_id
        self._run_entry_id = entry_id
        self._run_count = count
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _queue_run(self) -> None:
        """Pack the OK answer of the run `respond_adds_ok` was extending."""
        count = self._run_count
        self._run_count = 0
        if count == 1:
            self._add_oks += _ADD_OK_FRAME.pack(
                _ADD_OK_BODY_BYTES, 0x95, _OP_ADD_ENTRY, 0xCF, self._run_request_id, _STATUS_OK,
                0xCF, self._run_ledger_id, 0xCF, self._run_entry_id,
            )  # fmt: skip
            return
        self._add_oks += _ADDS_OK_FRAME.pack(
            _ADDS_OK_BODY_BYTES, 0x96, _OP_ADD_ENTRIES, 0xCF, self._run_request_id, _STATUS_OK,
            0xCF, self._run_ledger_id, 0xCF, self._run_entry_id, 0xCF, count,
        )  # fmt: skip

    def _flush(self) -> None:
        self._flush_scheduled = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._run_count:
            self._queue_run()
        if self._add_oks:
            batch = self._encoder.take() + self._add_oks if len(self._encoder) else self._add_oks
            self._add_oks = bytearray()
            transport.write(batch)
        elif len(self._encoder):
            # One vectored write: read answers' record buffers go out without being joined.
            transport.writelines(self._encoder.take_parts())
        if self._close_after_flush:
            self._closing = True
            self._closing_since = self._loop.time()
            transport.close()

    # --- flow control ------------------------------------------------------------------------

    def claim(self, request_id: int, count: int) -> bool:
        """Count `count` requests from `request_id` in flight, unless one of those ids is in
        flight already (False, nothing changed). Past the cap, reading pauses."""
        ids = self.inflight_ids
        if count == 1:
            if request_id in ids:
                return False
            ids.add(request_id)
        else:
            claimed = range(request_id, request_id + count)
            if not ids.isdisjoint(claimed):
                return False
            ids.update(claimed)
        self._inflight += count
        if self._inflight >= self._server.limits.max_inflight_per_connection:
            if not self._reading_paused:
                self._server.metrics.limit_hit("max_inflight_per_connection")
            self._update_reading()
        return True

    def is_in_flight(self, request_id: int) -> bool:
        return request_id in self.inflight_ids

    def release(self, request_id: int, count: int) -> None:
        """`count` requests from `request_id` were answered (or dropped): reading may resume,
        closing proceed."""
        if count == 1:
            self.inflight_ids.discard(request_id)
        else:
            self.inflight_ids.difference_update(range(request_id, request_id + count))
        self._inflight -= count
        if self._reading_paused:
            self._update_reading()
        if self._inflight == 0 and self._close_after_flush_when_idle and not self._backlog:
            self.close_after_flush()

    def track_long_poll(self, task: asyncio.Task[None]) -> None:
        """A long poll of this connection: cancelled if the connection is lost first."""
        self._long_polls.add(task)
        task.add_done_callback(self._long_polls.discard)

    def writing_paused(self) -> bool:
        return self._write_paused and self._transport is not None

    def unsent_bytes(self) -> int:
        transport = self._transport
        if transport is None:
            return 0
        return transport.get_write_buffer_size() + len(self._encoder)

    def pause_for_memory(self) -> None:
        self._memory_paused = True
        self._update_reading()

    def resume_after_memory(self) -> None:
        self._memory_paused = False
        self._update_reading()

    def pause_for_room(self) -> None:
        self._room_paused = True
        self._update_reading()

    def resume_after_room(self) -> None:
        self._room_paused = False
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
        pause = (
            over_limit
            or self._write_paused
            or self._memory_paused
            or self._room_paused
            or self._stopped_reading
        )
        if pause and not self._reading_paused:
            self._reading_paused = True
            transport.pause_reading()
        elif not pause and self._reading_paused:
            self._reading_paused = False
            if self._backlog:
                self._drain_backlog()  # May pause again.
            if not self._reading_paused and not transport.is_closing():
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
        """Close a connection that never said HELLO, stalls mid-frame, or sits idle too long;
        abort one being closed whose client has not read its last answers within
        `frame_timeout`."""
        transport = self._transport
        if transport is None:
            return
        if self._closing:
            # `close()` waits until the last answers are written: a client that reads nothing
            # would keep them, and its place among max_connections, for as long as it likes.
            since = self._closing_since
            if since is not None and now - since > frame_timeout:
                self._server.metrics.limit_hit("frame_read_timeout")
                log.info("connection_timed_out", peer=self.peer, reason="answers_unread")
                self._closing_since = None
                transport.abort()
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
            self._server.metrics.limit_hit(reason)
            log.info("connection_timed_out", peer=self.peer, reason=reason)
            self._closing = True
            transport.abort()
