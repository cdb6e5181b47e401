"""Quick comparison of the two embedded ordered KV stores the entry index could use.

Run: `python benchmarks/kv_bench.py [entries]` (needs the `bench` extra: rocksdict).
Measures, for LMDB (`lmdb`) and RocksDB
(`rocksdict`), the operations the index does: a durable batch of location puts (one flush),
point gets of random entries, and a floor seek for "the last entry of a ledger". The numbers
and the choice are written down in docs/storage.md. Not used at run time.
"""

from __future__ import annotations

import random
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import rocksdict

_KEY = struct.Struct(">qq")
_VALUE = struct.Struct(">III")
_LEDGERS = 100


def _keys(entry_count: int) -> list[bytes]:
    per_ledger = entry_count // _LEDGERS
    return [_KEY.pack(ledger, entry) for ledger in range(_LEDGERS) for entry in range(per_ledger)]


def _timed(label: str, operations: int, function: Callable[[], None]) -> None:
    started = time.perf_counter()
    function()
    elapsed = time.perf_counter() - started
    print(f"  {label:<28} {operations / elapsed:>12,.0f} ops/s   ({elapsed * 1000:8.1f} ms)")


def bench_lmdb(directory: Path, keys: list[bytes], probes: list[bytes]) -> None:
    env = lmdb.open(str(directory), map_size=1 << 34, max_dbs=2, sync=True)
    locations = env.open_db(b"locations")
    value = _VALUE.pack(1, 2, 3)

    def put_batches() -> None:
        for start in range(0, len(keys), 10_000):  # One flush = one durable write transaction.
            with env.begin(write=True, db=locations) as txn:
                for key in keys[start : start + 10_000]:
                    txn.put(key, value)

    def point_gets() -> None:
        with env.begin(db=locations) as txn:
            for key in probes:
                assert txn.get(key) is not None

    def floor_seeks() -> None:
        with env.begin(db=locations) as txn:
            cursor = txn.cursor()
            for ledger in range(_LEDGERS):
                # Past the end of the ledger, then one step back (or the last key overall).
                if cursor.set_range(_KEY.pack(ledger + 1, 0)):
                    assert cursor.prev()
                else:
                    assert cursor.last()
                assert _KEY.unpack(cursor.key())[0] == ledger

    print("lmdb")
    _timed("put (10k-entry durable txns)", len(keys), put_batches)
    _timed("point get", len(probes), point_gets)
    _timed("floor seek (last entry)", _LEDGERS, floor_seeks)
    env.close()


def bench_rocksdb(directory: Path, keys: list[bytes], probes: list[bytes]) -> None:
    db = rocksdict.Rdict(str(directory), options=rocksdict.Options(raw_mode=True))
    value = _VALUE.pack(1, 2, 3)
    sync = rocksdict.WriteOptions()
    sync.sync = True

    def put_batches() -> None:
        for start in range(0, len(keys), 10_000):
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key in keys[start : start + 10_000]:
                batch.put(key, value)
            db.write(batch, sync)

    def point_gets() -> None:
        for key in probes:
            assert db.get(key) is not None

    def floor_seeks() -> None:
        iterator = db.iter()
        for ledger in range(_LEDGERS):
            iterator.seek_for_prev(_KEY.pack(ledger, 2**63 - 1))
            assert iterator.valid() and _KEY.unpack(iterator.key())[0] == ledger

    print("rocksdict")
    _timed("put (10k-entry durable batch)", len(keys), put_batches)
    _timed("point get", len(probes), point_gets)
    _timed("floor seek (last entry)", _LEDGERS, floor_seeks)
    db.close()


def main() -> None:
    entry_count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    keys = _keys(entry_count)
    probes = random.Random(7).sample(keys, min(50_000, len(keys)))
    with tempfile.TemporaryDirectory() as lmdb_dir, tempfile.TemporaryDirectory() as rocks_dir:
        bench_lmdb(Path(lmdb_dir), keys, probes)
        bench_rocksdb(Path(rocks_dir), keys, probes)


if __name__ == "__main__":
    main()
