"""`bkaio shell readledger` of a ledger with a password, run without --password, says to pass it
instead of only "wrong password" (which reads as if a password had been given)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import initialise_cluster_at, open_metadata
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps

BOOKIE_IDS = [f"127.0.0.1:{3181 + 10 * i}" for i in range(3)]


async def _closed_ledger_with_password(uri: str, password: bytes) -> int:
    """A closed ledger written on in-process fake bookies: its metadata is all the CLI reads."""
    await initialise_cluster_at(uri)
    bookies = FakeBookieOps([FakeBookie(bookie_id) for bookie_id in BOOKIE_IDS])
    metadata = await open_metadata(uri)
    client = BookKeeper(
        ledgers=metadata.ledgers, ops=bookies, config=ClientConfig(), metadata=metadata
    )
    client.set_bookies([bookies.info(bookie_id) for bookie_id in BOOKIE_IDS])
    try:
        writer = await client.create_ledger(3, 3, 2, password=password)
        await writer.append(b"x")
        await writer.close()
        return writer.ledger_id
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("given", "hint"), [((), True), (("--password", "wrong"), False)], ids=["none", "wrong"]
)
def test_a_missing_password_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], given: tuple[str, ...], hint: bool
) -> None:
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    ledger_id = asyncio.run(_closed_ledger_with_password(uri, b"pw"))
    code = main(["shell", "readledger", str(ledger_id), *given, "--metadata", uri])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert f"ledger {ledger_id}: wrong password" in err
    assert ("pass --password" in err) is hint, err
