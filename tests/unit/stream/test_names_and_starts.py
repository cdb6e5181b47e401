"""Bad names and reader starts are argument errors of the call that passed them
(InvalidStreamArgumentError, an InvalidArgumentError), each saying what is wrong, over fake
bookies + SQLite metadata: never a TypeError, a "corrupt metadata" error, or a silent wait."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bkaio.cli.main import main
from bkaio.errors import InvalidArgumentError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.meta import initialise_cluster_at
from bkaio.stream import (
    InvalidStreamArgumentError,
    Namespace,
    StreamPosition,
    StreamTruncatedError,
    create_namespace,
    open_namespace,
)
from tests.unit.stream.conftest import ClientFactory
from tests.unit.stream.test_streams import take

BAD_NAMES = [
    ("", "must not be empty"),
    ("a/b", "must not contain '/'"),
    ("x" * 256, "is 256 characters, more than 255"),
    ("bad\x01", r"non-printable character '\\x01' at index 3"),
    (7, r"must be a str, not int \(7\)"),
]

Call = Callable[[BookKeeper, Namespace, Any], Awaitable[object]]

# Every way a name enters the stream API, with the kind of name it is.
CALLS: list[tuple[str, Call]] = [
    ("namespace", lambda bk, ns, name: open_namespace(bk, name, create=True)),
    ("namespace", lambda bk, ns, name: create_namespace(bk, name)),
    ("stream", lambda bk, ns, name: ns.create_stream(name)),
    ("stream", lambda bk, ns, name: ns.open_writer(name)),
    ("stream", lambda bk, ns, name: ns.open_reader(name)),
    ("stream", lambda bk, ns, name: ns.stream_metadata(name)),
    ("stream", lambda bk, ns, name: ns.end_seq(name)),
    ("stream", lambda bk, ns, name: ns.first_position(name)),
    ("stream", lambda bk, ns, name: ns.delete_stream(name)),
    ("stream", lambda bk, ns, name: ns.truncate(name, before=StreamPosition(0, 0, 0))),
    ("stream", lambda bk, ns, name: ns.cursors(name)),
    ("cursor", lambda bk, ns, name: ns.open_reader("s", cursor=name)),
    ("cursor", lambda bk, ns, name: ns.delete_cursor("s", name)),
]


@pytest.mark.parametrize(("name", "rule"), BAD_NAMES, ids=lambda v: repr(v)[:12])
async def test_a_bad_name_is_refused_as_an_argument_naming_the_rule(
    make_client: ClientFactory, name: object, rule: str
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    await ns.create_stream("s")
    for kind, call in CALLS:
        with pytest.raises(InvalidStreamArgumentError, match=f"^{kind} name .*{rule}") as raised:
            await call(bk, ns, name)
        assert isinstance(raised.value, InvalidArgumentError)  # The general argument error.


async def _three_records(make_client: ClientFactory) -> tuple[Namespace, list[StreamPosition]]:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    positions = [await writer.write(b"r%d" % i) for i in range(3)]
    await writer.close()
    return ns, positions


async def test_a_start_past_the_end_of_a_sealed_stream_is_refused_naming_the_next_seq(
    make_client: ClientFactory,
) -> None:
    ns, positions = await _three_records(make_client)
    ledger_id = positions[-1].ledger_id
    for seq in (4, 1_000_000):
        with pytest.raises(
            InvalidStreamArgumentError, match=f"start seq {seq} is past the end.*next seq 3"
        ):
            await ns.open_reader("s", start=StreamPosition(ledger_id, seq, seq))
    # The next seq is a good start: it delivers the next record written, once it is.
    async with await ns.open_reader("s", start=StreamPosition(ledger_id, 3, 3)) as reader:
        writer = await ns.open_writer("s")
        written = await writer.write(b"next")
        assert (await take(reader, 1))[0].position == written
        await writer.close()


async def test_a_start_past_the_end_of_an_open_stream_is_refused_naming_the_next_seq(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    positions = [await writer.write(b"r%d" % i) for i in range(3)]
    ledger_id = positions[0].ledger_id
    with pytest.raises(InvalidStreamArgumentError, match=r"start seq 1000000 .*next seq 3"):
        await ns.open_reader("s", start=StreamPosition(ledger_id, 1_000_000, 1_000_000))
    async with await ns.open_reader("s", start=StreamPosition(ledger_id, 1, 1)) as reader:
        assert [r.position for r in await take(reader, 2)] == positions[1:]
    async with await ns.open_reader("s", start=StreamPosition(ledger_id, 3, 3)) as reader:
        written = await writer.write(b"next")
        assert (await take(reader, 1))[0].position == written
    await writer.close()


@pytest.mark.parametrize(
    ("position", "field"),
    [((1, 0, -5), "seq -5"), ((-1, 0, 0), "ledger id -1"), ((1, -1, 0), "entry id -1")],
)
async def test_a_negative_position_is_an_argument_error_not_a_truncation(
    make_client: ClientFactory, position: tuple[int, int, int], field: str
) -> None:
    ns, _ = await _three_records(make_client)
    start = StreamPosition(*position)
    with pytest.raises(InvalidStreamArgumentError, match=f"has {field}: .* >= 0"):
        await ns.open_reader("s", start=start)
    with pytest.raises(InvalidStreamArgumentError, match=f"has {field}"):
        await ns.open_reader("s", start=start, cursor="c")  # Even where a cursor may win.


async def test_a_start_before_the_first_record_is_still_a_truncation(
    make_client: ClientFactory,
) -> None:
    bk = await make_client()
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s", roll_bytes=1)
    positions = [await writer.write(b"r%d" % i) for i in range(4)]
    await writer.close()
    await ns.truncate("s", before=positions[2])
    with pytest.raises(StreamTruncatedError, match="seq 0 was truncated"):
        await ns.open_reader("s", start=positions[0])


async def test_the_cli_judges_a_start_seq_as_the_api_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bkaio stream tail --from SEQ` on a stream no writer holds open (no bookie is needed):
    the next seq is a good start, a later one the API's error, a bad cursor name one line."""
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    await initialise_cluster_at(uri)

    def bkaio(*args: str) -> tuple[int, str]:
        code = main(["stream", *args, "--metadata", uri])
        return code, capsys.readouterr().err

    # main() runs its own event loop: off this test's loop, as the console script would.
    assert await asyncio.to_thread(bkaio, "create", "ns") == (0, "")
    assert await asyncio.to_thread(bkaio, "create", "ns/s") == (0, "")
    assert await asyncio.to_thread(bkaio, "tail", "ns/s", "--from", "0", "--no-follow") == (0, "")
    code, err = await asyncio.to_thread(bkaio, "tail", "ns/s", "--from", "5", "--no-follow")
    assert code == 1
    assert err.splitlines() == [
        "bkaio: InvalidStreamArgumentError: stream ns/s: start seq 5 is past the end of the "
        "stream (next seq 0): no record was written there; start at seq 0 or before, or at "
        "'latest'"
    ]
    code, err = await asyncio.to_thread(bkaio, "tail", "ns/s", "--cursor", "c/1", "--no-follow")
    # A bad cursor name is a usage error (exit 2), refused before connecting (8c471a1),
    # by the rule the stream layer states.
    assert (code, err.splitlines()) == (
        2,
        ["bkaio: UsageError: Invalid value for '--cursor': cursor name 'c/1' must not contain '/'"],
    )
