"""Codes of the wire protocol v1 (docs/protocol.md): the version, operation codes, request
flags and the integer widths fields are checked against. Values are wire format: never renumber.

A leaf of the codec: it imports only the status codes.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

from bkaio.status import Status

PROTOCOL_VERSION = 1
READ_ENTRIES_FEATURE = "read_entries"  # In a bookie's HELLO answer: it takes READ_ENTRIES.

U32_MAX = 2**32 - 1
I64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1

# Room left in a frame beside one entry's payload: an ADD carries ids, flags, the master key and
# a digest with it, a READ answer the same; 4 KiB is far above what they take. So an entry is
# at most max_frame_bytes - FRAME_ENVELOPE_BYTES: the bookie's default server.max_entry_bytes
# and the client's entry limit (`ClientConfig.max_entry_bytes`) both derive from it.
FRAME_ENVELOPE_BYTES = 4096

# A client's tailing long poll is cut into rounds this long (bkaio/ledger_client/read_handle.py);
# a bookie may not cap long polls below it (server.max_long_poll_seconds): a round answered
# early with nothing new is taken for bookies that cannot wait, and backed off from.
LONG_POLL_ROUND_SECONDS = 1.0


class Op(IntEnum):
    """Operation codes. Values are wire format: never renumber."""

    ERROR = 0
    HELLO = 1
    ADD_ENTRY = 2
    READ_ENTRY = 3
    READ_RANGE = 4
    READ_LAC = 5
    WRITE_LAC = 6
    FORCE = 7
    GET_BOOKIE_INFO = 8
    LIST_ENTRIES = 9
    PING = 10
    ADD_ENTRIES = 11  # Several adds of one ledger in one frame; bookie feature "add_entries".
    READ_ENTRIES = 12  # Range and stride reads, long polls with entries; feature "read_entries".


class Flag(IntFlag):
    """Request flags. Values are wire format: never renumber."""

    NONE = 0
    FENCE = 1  # READ_ENTRY / READ_RANGE / READ_LAC: fence the ledger; needs master_key.
    RECOVERY_ADD = 2  # ADD_ENTRY: allowed on a fenced ledger (recovery re-writes).
    LONG_POLL = 4  # READ_LAC / READ_ENTRIES: reply once the LAC exceeds previous_lac, or at
    # timeout_ms.


FLAG_MASK = int(Flag.FENCE | Flag.RECOVERY_ADD | Flag.LONG_POLL)
assert FLAG_MASK & (FLAG_MASK + 1) == 0, "flags are contiguous low bits: a tuple indexes them"
_FLAGS: tuple[Flag, ...] = tuple(Flag(value) for value in range(FLAG_MASK + 1))
_STATUSES: tuple[Status, ...] = tuple(Status)
assert all(status.value == index for index, status in enumerate(_STATUSES)), "dense statuses"
