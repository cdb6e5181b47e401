"""A one-shot admin probe of a bookie shard over the wire protocol: HELLO, then GET_BOOKIE_INFO.

    space = await probe_bookie(host, port, tls=context, auth_token=token)

Used by `bkaio shell listbookies` / `bookieinfo` and by a bookie answering
`/api/v1/bookie/list_bookie_info` about the others. The figures are the bookie's space as
bkaio/bookie/space.py defines it. Raw protocol bodies (docs/protocol.md) over asyncio streams:
an admin command makes one exchange, so the data path's pipelined connection machinery would
only add weight here.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from bkaio.errors import ProtocolError, error_for_status
from bkaio.protocol.frames import FrameDecoder, frame_parts
from bkaio.protocol.messages import PROTOCOL_VERSION, Op
from bkaio.status import Status

PROBE_TIMEOUT_SECONDS = 3.0
PROBE_MAX_FRAME_BYTES = 64 * 1024  # Control replies only; anything bigger is a broken peer.


@dataclass(frozen=True, slots=True)
class ProbedBookie:
    total_bytes: int
    free_bytes: int
    shard_index: int
    shard_count: int
    read_only: bool


async def probe_bookie(
    host: str, port: int, *, tls: ssl.SSLContext | None = None, auth_token: str | None = None
) -> ProbedBookie:
    """Ask one bookie shard for its disk space and state."""
    token = auth_token or None
    async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        try:
            decoder = FrameDecoder(max_frame_bytes=PROBE_MAX_FRAME_BYTES)
            hello = await _exchange(
                reader, writer, decoder, [Op.HELLO, 1, PROTOCOL_VERSION, "bkaio-probe", token]
            )
            _check(hello, Op.HELLO)
            info = await _exchange(reader, writer, decoder, [Op.GET_BOOKIE_INFO, 2])
            _check(info, Op.GET_BOOKIE_INFO)
            total, free, shard_index, shard_count, read_only = info[3:8]
            if not (
                isinstance(total, int)
                and isinstance(free, int)
                and isinstance(shard_index, int)
                and isinstance(shard_count, int)
            ):
                raise ProtocolError(f"GET_BOOKIE_INFO reply has non-integer fields: {info!r}")
            return ProbedBookie(total, free, shard_index, shard_count, bool(read_only))
        finally:
            writer.close()
            await writer.wait_closed()


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    decoder: FrameDecoder,
    body: list[object],
) -> list[object]:
    writer.writelines(frame_parts(body))
    await writer.drain()
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionResetError("bookie closed the connection")
        bodies = decoder.feed(data)
        if bodies:
            return list(bodies[0])


def _check(body: list[object], op: Op) -> None:
    if len(body) < 3 or body[0] not in (op, Op.ERROR):
        raise ProtocolError(f"unexpected reply to {op.name}: {body[:3]!r}")
    status = Status(int(body[2]))  # type: ignore[call-overload]
    if status is not Status.OK:
        raise error_for_status(status, f"{op.name} refused: {status.name}")
