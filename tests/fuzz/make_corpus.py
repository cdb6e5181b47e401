"""Write the seed corpus of the decoder fuzzer: one valid frame per operation, and a few bad ones.

python tests/fuzz/make_corpus.py        # (re)writes tests/fuzz/corpus/decoder/seed-*
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bkaio.protocol.digest import master_key
from bkaio.protocol.frames import encode_frame
from bkaio.protocol.messages import Op

KEY = master_key(b"fuzz", 3)
BODIES: dict[str, list[object]] = {
    "hello": [int(Op.HELLO), 1, 1, "fuzz-client", "token"],
    "add": [int(Op.ADD_ENTRY), 2, 3, 0, 0, KEY, -1, 5, 123, b"hello"],
    "read": [int(Op.READ_ENTRY), 3, 3, -1, 1, KEY],
    "range": [int(Op.READ_RANGE), 4, 3, 0, 100, 4096, 0, None],
    "lac": [int(Op.READ_LAC), 5, 3, 4, None, 7, 1000],
    "write_lac": [int(Op.WRITE_LAC), 6, 3, KEY, 9],
    "force": [int(Op.FORCE), 7, 3],
    "info": [int(Op.GET_BOOKIE_INFO), 8],
    "list": [int(Op.LIST_ENTRIES), 9, 3],
    "ping": [int(Op.PING), 10],
    "hello_response": [int(Op.HELLO), 1, 0, 1, "b:1", 0, 1, ["read_range"]],
    "read_response": [int(Op.READ_ENTRY), 3, 0, 3, 0, -1, [-1, 5, 123, b"hello"]],
    "range_response": [int(Op.READ_RANGE), 4, 0, 3, 0, [[0, -1, 5, 123, b"hello"]]],
}


def main() -> None:
    directory = Path(__file__).resolve().parent / "corpus" / "decoder"
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in BODIES.items():
        # First byte 0: no chunking pattern (see decoder_target.one_input).
        (directory / f"seed-{name}").write_bytes(b"\0" + encode_frame(body))
    pipelined = b"".join(encode_frame(body) for body in BODIES.values())
    (directory / "seed-pipelined-chunked").write_bytes(b"\x03\x01\x07\x00" + pipelined)
    (directory / "seed-oversized").write_bytes(b"\0" + struct.pack(">I", 0xFFFFFFFF))
    (directory / "seed-nested").write_bytes(b"\0" + struct.pack(">I", 1001) + b"\x91" * 1001)


if __name__ == "__main__":
    main()
