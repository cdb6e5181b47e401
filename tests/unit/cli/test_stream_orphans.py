"""`bkaio stream orphans NS [--older-than S] [--delete] [--json]` (bkaio/cli/stream_orphans.py):
bad input is one line and the CLI's exit codes; a listing and a delete through `main`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_orphans import crash_between_create_and_cas

SQLITE = "sqlite:////proc/nonexistent/meta.db"  # Never opened: validation comes first.


@pytest.mark.parametrize(
    ("older_than", "complaint"),
    [("-1", "-1.0 is not in the range x>=0"), ("soon", "'soon' is not a valid float"),
     ("nan", "not a finite number")],
)  # fmt: skip
def test_a_bad_age_is_a_usage_error(
    older_than: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["stream", "orphans", "tenant", "--older-than", older_than, "--metadata", SQLITE])
    assert code == 2
    err = capsys.readouterr().err
    assert "--older-than" in err and complaint in err


async def test_lists_then_deletes_and_refuses_an_unknown_namespace(
    make_client: ClientFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    orphan_id = await crash_between_create_and_cas(bk, "s", 1)
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    base = ["stream", "orphans", "--metadata", uri, "--json"]

    def bkaio(*args: str) -> tuple[int, str, str]:
        code = main([*base, *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, _ = await asyncio.to_thread(bkaio, "tenant")
    assert code == 0 and json.loads(out) == []  # Younger than the default hour.
    code, out, _ = await asyncio.to_thread(bkaio, "tenant", "--older-than", "0")
    assert code == 0
    assert [row["ledger_id"] for row in json.loads(out)] == [orphan_id]
    code, out, _ = await asyncio.to_thread(bkaio, "tenant", "--older-than", "0", "--delete")
    assert code == 0
    (row,) = json.loads(out)
    assert (row["ledger_id"], row["action"]) == (orphan_id, "deleted")
    code, _, err = await asyncio.to_thread(bkaio, "nope")
    assert code == 1 and "'nope'" in err and "NamespaceNotFoundError" in err
