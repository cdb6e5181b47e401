"""The narrow interfaces between a shard's connections and its request handling.

`AddRequests` is the typed batch the connection hands over for the one add path: the adds of
one frame, checked by the codec (`bkaio.protocol.adds.AddFrame`), with who to answer; storage
takes the same object as its batch and hands it back once durable.

`Peer` is what the request handling (`ShardServer`, bkaio/bookie/server.py) asks of a client
connection: answer, count requests in flight, pause and resume reading. `RequestHandler` is
what a connection (`BookieServerProtocol`, bkaio/bookie/connection.py) asks of the request
handling: admit or refuse it, answer HELLO, take requests and adds. The connection owns its
socket, its frames and its flow control; the server owns dispatch, limits shared by the shard,
and storage. Neither module imports the other, and neither touches the other's state.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from bkaio.config import ServerConfig
from bkaio.protocol.adds import AddFrame
from bkaio.protocol.messages import HelloRequest, Request, Response

from .metrics import ShardMetrics

__all__ = ["AddRequests", "Peer", "RequestHandler"]


class Peer(Protocol):
    """One client connection, as the request handling sees it. Event loop only."""

    def __hash__(self) -> int:
        """By identity: a connection keys the shard's per-connection counts."""
        ...

    @property
    def peer(self) -> str:
        """The client's address, for logs."""
        ...

    def respond(self, response: Response) -> None:
        """Queue `response`; what is queued in one loop iteration goes out in one write."""
        ...

    def respond_add_ok(self, request_id: int, ledger_id: int, entry_id: int) -> None:
        """Queue the OK answer to one add."""
        ...

    def respond_adds_ok(self, request_id: int, ledger_id: int, entry_id: int, count: int) -> None:
        """Queue OK answers to `count` adds of ADD_ENTRIES frames with consecutive request and
        entry ids; answers that continue each other may leave as one ADD_ENTRIES answer."""
        ...

    def claim(self, request_id: int, count: int) -> bool:
        """Count requests `request_id` .. `request_id + count - 1` in flight; False, changing
        nothing, when one of their ids is in flight already (two answers under one id would be
        ambiguous). May pause reading (the per-connection in-flight cap)."""
        ...

    def is_in_flight(self, request_id: int) -> bool:
        """Whether a request of this id is being executed."""
        ...

    def release(self, request_id: int, count: int) -> None:
        """Those requests are answered (or dropped): reading may resume, closing proceed."""
        ...

    def track_long_poll(self, task: asyncio.Task[None]) -> None:
        """A long poll of this connection: cancelled when the connection is lost."""
        ...

    def writing_paused(self) -> bool:
        """Whether its transport's unsent bytes are above `server.write_buffer_high_bytes` (until
        they drain to a quarter of it; then `RequestHandler.writing_resumed`). False once the
        connection is gone."""
        ...

    def unsent_bytes(self) -> int:
        """Answer bytes queued or handed to the transport and not sent yet."""
        ...

    def pause_for_memory(self) -> None: ...
    def resume_after_memory(self) -> None: ...
    def pause_for_room(self) -> None: ...
    def resume_after_room(self) -> None: ...

    def stop_reading(self) -> None:
        """Shutdown: read no more requests; the ones in flight are still answered."""
        ...

    def close_after_flush(self) -> None: ...

    def check_deadlines(
        self, now: float, *, hello_timeout: float, frame_timeout: float, idle_timeout: float
    ) -> None:
        """Close the connection if it is past its HELLO, partial-frame or idle deadline."""
        ...


@dataclass(slots=True, eq=False)
class AddRequests(AddFrame):
    """A frame of adds with who asked and when: the one add path's batch in every layer.

    `peer`, `started` and `size` (the memory charged for it) are set by the request handling
    when it takes the frame (`RequestHandler.add`).
    """

    peer: Peer = field(init=False, repr=False)
    started: float = field(init=False, repr=False)
    size: int = field(init=False, repr=False)


class RequestHandler(Protocol):
    """A shard's request handling, as its connections see it. Event loop only."""

    @property
    def limits(self) -> ServerConfig: ...

    @property
    def metrics(self) -> ShardMetrics: ...

    def open_connection(self, peer: Peer) -> str | None:
        """Admit a new connection (None) or say why not ("max_connections", "stopping")."""
        ...

    def close_connection(self, peer: Peer) -> None:
        """The connection is gone: forget it."""
        ...

    def writing_resumed(self, peer: Peer) -> None:
        """`peer`'s unsent bytes drained below the low-water mark: its reads may answer."""
        ...

    def hello(self, request: HelloRequest) -> tuple[Response, bool]:
        """The answer to a HELLO and whether the connection may go on."""
        ...

    def refusal_delay(self, host: str, now: float) -> float:
        """How long to hold back the answer to a HELLO with a wrong token from `host`."""
        ...

    def dispatch(self, peer: Peer, request: Request) -> None:
        """Execute a request other than an add; its answer goes to `peer.respond`."""
        ...

    def add(self, peer: Peer, frame: AddRequests) -> None:
        """Execute the adds of `frame` (the one add path); their answers go to `peer`."""
        ...
