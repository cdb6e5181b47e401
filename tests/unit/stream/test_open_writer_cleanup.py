"""open_writer whose record write fails outright (the store refused it or was unreachable;
not a lost reply) deletes the ledger it created for the new segment: it was left behind,
named by no record, on every such failure."""

from __future__ import annotations

import pytest

from bkaio.errors import MetadataError
from bkaio.stream import open_namespace
from bkaio.stream.model import StreamMeta
from bkaio.stream.store import StreamStore
from tests.unit.stream.conftest import ClientFactory


@pytest.mark.parametrize("existing", [False, True], ids=["new-stream", "existing-stream"])
async def test_a_failed_record_write_leaves_no_ledger(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    if existing:
        writer = await ns.open_writer("s")
        await writer.write(b"record")
        await writer.close()
    before = [ledger_id async for ledger_id in bk.list_ledgers()]

    async def unreachable(self: StreamStore, namespace: str, stream: str, meta: StreamMeta) -> None:
        raise MetadataError("metadata store unreachable")

    monkeypatch.setattr(StreamStore, "put_stream", unreachable)
    with pytest.raises(MetadataError, match="unreachable"):
        await ns.open_writer("s")
    monkeypatch.undo()
    assert [ledger_id async for ledger_id in bk.list_ledgers()] == before
    writer = await ns.open_writer("s")  # The stream is as it was.
    assert (await writer.write(b"next")).seq == (1 if existing else 0)
    await writer.close()
