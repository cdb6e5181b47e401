"""The closed set of status codes a bookie answers with (docs/protocol.md, "Status").

A leaf module below both `bkaio.errors` and `bkaio.protocol`: it imports nothing from bkaio, so
`bkaio.errors` maps each code to one exception class without loading the protocol package (whose
messages import `bkaio.errors`). `bkaio.protocol.status` re-exports it for the codec's users.
Values are wire format: never renumber.
"""

from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    UNAUTHORIZED = 4
    BAD_REQUEST = 5
    READ_ONLY = 6
    TOO_MANY_REQUESTS = 7
    IO_ERROR = 8
    UNSUPPORTED_VERSION = 9
    TIMEOUT = 10
    WRONG_SHARD = 11  # The ledger belongs to another shard: route by ledger_id % shard_count.
    ENTRY_CONFLICT = 12  # Entry id already stored with a different payload.
    BAD_DIGEST = 13  # The add's digest does not match its bytes.
    INTERNAL_ERROR = 14
    # The bookie may have lost this entry (its disks were reformatted; the ledger is in limbo
    # until it copied its fragments back): neither "absent" nor "present" (docs/autorecovery.md).
    DATA_UNKNOWN = 15
