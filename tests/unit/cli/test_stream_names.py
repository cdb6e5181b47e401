"""`bkaio stream ...` checks every namespace, stream and cursor name it is given before it
connects: a bad one is one line naming the rule it breaks and exit 2. "ns/" in particular is
not namespace ns: `bkaio stream delete "ns/$STREAM" --force` with $STREAM empty deleted the
whole namespace. A namespace `retain` is told to apply that does not exist is an error, not
"nothing to remove"."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory

SQLITE = "sqlite:////proc/nonexistent/meta.db"  # Never opened: validation comes first.


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("create", "tenant/"), "stream name must not be empty"),
        (("delete", "tenant/", "--force"), "stream name must not be empty"),
        (("write", "tenant/", "x"), "stream name must not be empty"),
        (("create", "tenant/" + "x" * 300), "300 characters, more than 255"),
        (("create", "tenant/a\tb"), "non-printable character"),
        (("info", "tenant/a/b"), "must not contain '/'"),
        (("create", "a\tb"), "namespace name"),
        (("info", "tenant"), "is not NAMESPACE/STREAM"),
        (("tail", "tenant/s", "--cursor", ""), "cursor name must not be empty"),
        (("tail", "tenant/s", "--cursor", "a/b"), "cursor name 'a/b' must not contain '/'"),
        (("list", "a/b"), "namespace name 'a/b' must not contain '/'"),
        (("retain", "ok", ""), "namespace name must not be empty"),
        (("orphans", "a\nb"), "non-printable character"),
    ],
)
def test_a_bad_name_is_a_usage_error(
    args: tuple[str, ...], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["stream", *args, "--metadata", SQLITE])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "UsageError" in captured.err and complaint in captured.err, captured.err


async def test_an_empty_stream_name_deletes_no_namespace(
    make_client: ClientFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = await make_client()
    namespace = await open_namespace(bk, "tenant", create=True)
    await namespace.create_stream("orders")
    uri = f"sqlite://{tmp_path / 'meta.db'}"

    code = await asyncio.to_thread(
        main, ["stream", "delete", "tenant/", "--force", "--metadata", uri]
    )
    assert code == 2, capsys.readouterr()
    assert await namespace.list_streams() == ["orders"]


async def test_retain_refuses_an_unknown_namespace(
    make_client: ClientFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bk = await make_client()
    await open_namespace(bk, "tenant", create=True)
    base = ["stream", "retain", "--metadata", f"sqlite://{tmp_path / 'meta.db'}"]

    assert await asyncio.to_thread(main, [*base, "tenant"]) == 0
    assert capsys.readouterr().out == "nothing to remove\n"
    assert await asyncio.to_thread(main, [*base, "tenant", "tenat"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "NamespaceNotFoundError" in captured.err, captured
    assert "'tenat'" in captured.err


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("tenant/s", "--retention-seconds", "60", "--rack", "r1"),
         "only a namespace takes --retention-seconds, --rack: give it when namespace tenant"),
        (("tenant/s", "--ensemble-size", "3"), "only a namespace takes --ensemble-size"),
        (("tenant", "--write-quorum", "3", "--ensemble-size", "2"),
         "need --ensemble-size >= --write-quorum >= --ack-quorum"),
        (("tenant", "--ack-quorum", "3"), "need --ensemble-size >= --write-quorum"),
    ],
)  # fmt: skip
def test_create_refuses_settings_it_would_not_apply(
    args: tuple[str, ...], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Namespace settings given with NS/STREAM were dropped in silence (the stream created, its
    namespace unchanged), and quorums out of order failed only after connecting (exit 1)."""
    assert main(["stream", "create", *args, "--metadata", SQLITE]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and complaint in captured.err, captured.err
