"""The entry record: how an entry lies in a bookie's entry logs and travels in a READ_ENTRIES
answer (docs/protocol.md, "Range reads"; docs/storage.md, "On-disk layout").

    record  u32 body length | u32 crc32c(body) | body
    body    i64 ledger_id | i64 entry_id | i64 lac | i64 length | u32 digest | payload

One format for both, so a bookie sends a run of records read from disk as it is. A leaf below
the codec and ledger storage (it imports only struct and crc32c), so neither imports the other
for it.
"""

from __future__ import annotations

import struct

import crc32c

# The record head up to the payload: body length, record checksum, then the body's ids.
RECORD_HEAD = struct.Struct(">IIqqqqI")
RECORD_HEAD_BYTES = RECORD_HEAD.size  # 44
RECORD_PREFIX_BYTES = 8  # Body length and record checksum.
RECORD_BODY_HEAD_BYTES = RECORD_HEAD_BYTES - RECORD_PREFIX_BYTES  # 36: ids, lac, length, digest.
_PREFIX = struct.Struct(">II")
_BODY_HEAD = struct.Struct(">qqqqI")
_crc32c = crc32c.crc32c


def pack_record(
    ledger_id: int, entry_id: int, lac: int, length: int, digest: int, payload: bytes
) -> tuple[bytes, bytes]:
    """One record as (head, payload): the two buffers to send, the payload not copied."""
    body_head = _BODY_HEAD.pack(ledger_id, entry_id, lac, length, digest)
    checksum = _crc32c(payload, _crc32c(body_head))
    return _PREFIX.pack(len(body_head) + len(payload), checksum) + body_head, payload


def record_fields(records: bytes, offset: int) -> tuple[int, int, int, int, int]:
    """(ledger_id, entry_id, lac, length, digest) of the whole record at `offset`."""
    _, _, ledger_id, entry_id, lac, length, digest = RECORD_HEAD.unpack_from(records, offset)
    return ledger_id, entry_id, lac, length, digest
