"""The records a bookie's layers hand each other on the add path.

`StoredEntry`: one entry of a ledger with everything a bookie keeps of it. `AddBatch`: adds of
one ledger under one master key, the unit of the add path in every layer. The codec builds them
from an ADD_ENTRY or ADD_ENTRIES frame (`bkaio.protocol.adds.AddFrame` is an `AddBatch`), the
request handling passes the same object on (bkaio/bookie/interfaces.py), ledger storage keeps
the entries in its write cache and entry logs and answers the batch, and the journal writes the
entries' fields. A leaf module below all of them (it imports only `bkaio.errors`), so that none
of those packages imports another for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bkaio.errors import BKError


# Not frozen, though never changed once built: a frozen dataclass's __init__ sets each field
# through object.__setattr__, 0.78 µs against 0.20 µs, and every add builds one.
@dataclass(slots=True)
class StoredEntry:
    ledger_id: int
    entry_id: int
    lac: int  # Piggybacked LAC the writer sent with this entry.
    length: int  # Ledger length after this entry.
    digest: int  # CRC32C as computed by the writer (bkaio.protocol.digest); stored verbatim.
    payload: bytes

    def same_content(self, other: StoredEntry) -> bool:
        """Identical re-adds are allowed; anything else under the same id is a conflict."""
        return (
            self.digest == other.digest
            and self.payload == other.payload
            and self.lac == other.lac
            and self.length == other.length
        )


@dataclass(slots=True, eq=False)
class AddBatch:
    """Adds of one ledger under one master key, in order: what ledger storage's `add_entries`
    takes (an ADD_ENTRY is a batch of one).

    The batch is durable, or failed as a whole, when storage calls the callback given with it.
    `failures` (index in `entries` -> error) is set by storage for adds refused one by one (a
    different entry already stored under the same id); the batch's other adds are durable when
    the callback reports no error. Layers above storage subclass it with what they need to
    answer the adds; storage hands the same objects back.
    """

    ledger_id: int
    master_key: bytes
    recovery: bool  # Allowed on a fenced ledger (a recovery re-writes entries).
    entries: list[StoredEntry]
    failures: dict[int, BKError] | None = field(default=None, init=False)
