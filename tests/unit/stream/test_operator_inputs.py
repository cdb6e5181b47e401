"""Inputs an operator or a library user gets wrong (found by an operator walk-through): each is
refused with an error that says what is wrong, and nothing is lost. Fake bookies + SQLite."""

from __future__ import annotations

import pytest

from bkaio.stream import NamespaceNotEmptyError, delete_namespace, open_namespace
from tests.unit.stream.conftest import ClientFactory


async def test_a_namespace_not_empty_says_how_to_force_from_the_api_and_the_cli(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    with pytest.raises(NamespaceNotEmptyError) as raised:
        await delete_namespace(bk, "tenant")
    assert "force=True (the CLI's --force)" in str(raised.value)
    assert await ns.list_streams() == ["s"]  # Nothing removed.
