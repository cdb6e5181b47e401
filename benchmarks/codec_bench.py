"""Codec throughput: 1 KiB ADD_ENTRY requests and their responses, encoded and decoded on one core.

    .venv/bin/python benchmarks/codec_bench.py [--seconds 2] [--payload-bytes 1024] [--batch 64]

Each row runs for about --seconds and prints messages per second and microseconds per message.
Encoding goes through a FrameEncoder in batches (as a connection does per loop iteration);
decoding feeds each batch to a FrameDecoder and decodes every body into a typed message.
The target is at least 300k ADD_ENTRY requests encoded + decoded per second.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bkaio.protocol import (
    AddEntryRequest,
    AddEntryResponse,
    Flag,
    FrameDecoder,
    FrameEncoder,
    Status,
    decode_request,
    decode_response,
    entry_digest,
    master_key,
)


def _rate(run_batch: Callable[[], None], batch: int, seconds: float) -> float:
    """Messages per CPU second of `run_batch` (which handles `batch` messages), over ~`seconds`.

    CPU time rather than wall time: the box is shared, and a message's cost is what we want,
    not how long other processes kept this one off the core.
    """
    run_batch()  # Warm up.
    done = 0
    started = time.process_time()
    deadline = started + seconds
    while True:
        for _ in range(16):
            run_batch()
        done += 16 * batch
        now = time.process_time()
        if now >= deadline:
            return done / (now - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each row")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64, help="messages per encoder batch")
    args = parser.parse_args()
    batch: int = args.batch

    key = master_key(b"bench", 0)
    payload = bytes(range(256)) * (args.payload_bytes // 256) + b"x" * (args.payload_bytes % 256)
    requests = [
        AddEntryRequest(
            request_id=i,
            ledger_id=7,
            entry_id=i,
            flags=Flag.NONE,
            master_key=key,
            lac=i - 1,
            length=(i + 1) * len(payload),
            digest=entry_digest(7, i, i - 1, (i + 1) * len(payload), payload),
            payload=payload,
        )
        for i in range(batch)
    ]
    responses = [AddEntryResponse(i, Status.OK, 7, i) for i in range(batch)]
    encoder = FrameEncoder()
    decoder = FrameDecoder()
    for request in requests:
        encoder.add(request)
    request_wire = encoder.take()
    for response in responses:
        encoder.add(response)
    response_wire = encoder.take()

    def encode_requests() -> None:
        for request in requests:
            encoder.add(request)
        encoder.take()

    def decode_requests() -> None:
        for body in decoder.feed(request_wire):
            decode_request(body)

    def round_trip_requests() -> None:
        for request in requests:
            encoder.add(request)
        for body in decoder.feed(encoder.take()):
            decode_request(body)

    def encode_responses() -> None:
        for response in responses:
            encoder.add(response)
        encoder.take()

    def decode_responses() -> None:
        for body in decoder.feed(response_wire):
            decode_response(body)

    def round_trip_responses() -> None:
        for response in responses:
            encoder.add(response)
        for body in decoder.feed(encoder.take()):
            decode_response(body)

    def digests() -> None:
        for request in requests:
            entry_digest(7, request.entry_id, request.lac, request.length, request.payload)

    rows: list[tuple[str, Callable[[], None]]] = [
        ("ADD_ENTRY request encode", encode_requests),
        ("ADD_ENTRY request decode", decode_requests),
        ("ADD_ENTRY request encode+decode", round_trip_requests),
        ("ADD_ENTRY response encode", encode_responses),
        ("ADD_ENTRY response decode", decode_responses),
        ("ADD_ENTRY response encode+decode", round_trip_responses),
        ("entry digest (CRC32C)", digests),
    ]
    print(f"payload {len(payload)} B, batch {batch}, {args.seconds:g} s per row, one core")
    print(f"{'operation':<36} {'messages/s':>12} {'us/message':>11}  (per CPU second)")
    for name, run_batch in rows:
        rate = _rate(run_batch, batch, args.seconds)
        print(f"{name:<36} {rate:>12,.0f} {1e6 / rate:>11.2f}")


if __name__ == "__main__":
    main()
