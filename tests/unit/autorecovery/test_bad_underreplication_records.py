"""A /underreplicated/<ledger> record that does not decode (bytes that are not msgpack, fields of
the wrong type, a key that is not a ledger id) is skipped by the listing, the workers' scan and
`shell listunderreplicated`: logged at ERROR and counted once per key and version, left in place
for an operator to delete, while the other marks are listed and claimed as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
from click.testing import CliRunner
from structlog.testing import capture_logs

from bkaio import autorecovery
from bkaio.cli.shell import shell
from bkaio.meta import BadUnderreplicationRecord, Metadata, open_metadata
from bkaio.meta.autorecovery import BAD_RECORDS, UNDERREPLICATED_PREFIX

NOT_MSGPACK = UNDERREPLICATED_PREFIX + f"{1:020d}"
WRONG_TYPES = UNDERREPLICATED_PREFIX + f"{2:020d}"
NOT_A_LEDGER_ID = UNDERREPLICATED_PREFIX + "not-a-ledger"
SHORT_ID = UNDERREPLICATED_PREFIX + "3"  # Not the padded key `complete` would delete.


async def _put_bad_records(meta: Metadata) -> None:
    good_value = msgpack.packb({"missing_bookies": ["b:1"], "ctime_ms": 1})
    await meta.store.put(NOT_MSGPACK, b"\xc1\xc1 not msgpack")
    await meta.store.put(WRONG_TYPES, msgpack.packb({"missing_bookies": "b:1", "ctime_ms": "x"}))
    await meta.store.put(NOT_A_LEDGER_ID, good_value)
    await meta.store.put(SHORT_ID, good_value)


def _skipped(logs: Sequence[Mapping[str, Any]]) -> list[object]:
    return [e["key"] for e in logs if e["event"] == "underreplication_bad_record_skipped"]


async def test_the_listing_skips_bad_records_and_reports_each_once(meta: Metadata) -> None:
    await _put_bad_records(meta)
    await meta.underreplication.mark(5, ["b:1"])
    counted = BAD_RECORDS._value.get()
    bad: list[BadUnderreplicationRecord] = []
    with capture_logs() as logs:
        records = await autorecovery.list_under_replicated(meta, bad=bad)
        for _ in range(3):  # Later scans: nothing logged or counted again.
            assert [r.ledger_id for r in await autorecovery.list_under_replicated(meta)] == [5]
    assert [r.ledger_id for r in records] == [5]
    assert sorted(item.key for item in bad) == sorted(
        [NOT_MSGPACK, WRONG_TYPES, NOT_A_LEDGER_ID, SHORT_ID]
    )
    assert all(item.key in item.error for item in bad)
    assert sorted(map(str, _skipped(logs))) == sorted(item.key for item in bad)
    assert all(e["log_level"] == "error" for e in logs if e["key"] in _skipped(logs))
    assert BAD_RECORDS._value.get() == counted + 4
    status = await autorecovery.autorecovery_status(meta)
    assert status.under_replicated_ledgers == 1
    # The same key written again (a new version) is reported again, once.
    await meta.store.put(NOT_MSGPACK, b"\xc1 still not msgpack")
    with capture_logs() as logs:
        for _ in range(2):
            assert [r.ledger_id async for r in meta.underreplication.list()] == [5]
    assert _skipped(logs) == [NOT_MSGPACK]
    assert BAD_RECORDS._value.get() == counted + 5


async def test_a_worker_claims_past_a_bad_record_and_leaves_it(meta: Metadata) -> None:
    await _put_bad_records(meta)
    await meta.underreplication.mark(5, ["b:1"])
    lease = await meta.store.grant_lease(30.0)
    claimed = await meta.underreplication.claim_next(lease, owner="worker")
    assert claimed is not None and claimed.ledger_id == 5
    assert await meta.underreplication.complete(claimed)
    assert await meta.underreplication.claim_next(lease, owner="worker") is None
    for key in (NOT_MSGPACK, WRONG_TYPES, NOT_A_LEDGER_ID, SHORT_ID):
        assert await meta.store.get(key) is not None  # Only an operator deletes it.
    await lease.revoke()


def test_listunderreplicated_names_a_bad_record_on_stderr(sqlite_metadata_uri: str) -> None:
    async def prepare() -> None:
        meta = await open_metadata(sqlite_metadata_uri)
        try:
            await _put_bad_records(meta)
            await meta.underreplication.mark(5, ["b:1"])
        finally:
            await meta.close()

    asyncio.run(prepare())
    result = CliRunner().invoke(
        shell, ["listunderreplicated", "--json", "--metadata", sqlite_metadata_uri]
    )
    assert result.exit_code == 0, result.output
    assert [row["ledger_id"] for row in json.loads(result.stdout)] == [5]
    assert NOT_MSGPACK in result.stderr and NOT_A_LEDGER_ID in result.stderr
    assert "bad record" in result.stderr
