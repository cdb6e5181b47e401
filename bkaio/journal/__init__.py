"""The bookie's write-ahead journal: records, group-committed write + fdatasync, replay,
roll-over and checkpoint marks. Imports neither `protocol` nor `meta`.

Typical use by ledger storage:

    journal = await Journal.open(config.journal, directory=directory)  # one per directory
    result = await loop.run_in_executor(None, journal.replay, checkpoint_mark)
    mark = await journal.append(EntryRecord(...))            # durable when it resolves
    ...
    await journal.delete_files_before(checkpoint_mark)      # after a ledger storage flush
    await journal.close()
"""

from bkaio.journal.config import JournalConfig
from bkaio.journal.errors import (
    CorruptRecordError,
    JournalError,
    JournalFormatError,
    JournalFullError,
    RecordError,
    TruncatedRecordError,
)
from bkaio.journal.journal import Journal, open_journal
from bkaio.journal.records import (
    CheckpointRecord,
    EntryRecord,
    FenceRecord,
    JournalMark,
    JournalRecord,
    LacRecord,
    MasterKeyRecord,
    RecordKind,
    decode_record,
    encode_entry,
    encode_record,
    record_ledger_id,
)
from bkaio.journal.replay import JournalReader
from bkaio.journal.stats import JournalStats
from bkaio.wal.records import Corruption, ReplayResult, TornTail

__all__ = [
    "CheckpointRecord",
    "CorruptRecordError",
    "Corruption",
    "EntryRecord",
    "FenceRecord",
    "Journal",
    "JournalConfig",
    "JournalError",
    "JournalFormatError",
    "JournalFullError",
    "JournalMark",
    "JournalReader",
    "JournalRecord",
    "JournalStats",
    "LacRecord",
    "MasterKeyRecord",
    "RecordError",
    "RecordKind",
    "ReplayResult",
    "TornTail",
    "TruncatedRecordError",
    "decode_record",
    "encode_entry",
    "encode_record",
    "open_journal",
    "record_ledger_id",
]
