"""Typed, validated command-line values: a bad one is a one-line usage error (exit 2).

Every `bkaio` argument that names something (a ledger, an entry, a bookie, a metadata store, a
range) goes through one of these click types, so a negative ledger id or a mistyped URI never
reaches the library (where it would be an assertion or a late, confusing failure).
"""

from __future__ import annotations

import math
import string
from typing import Any

import click

MAX_ID = 2**63 - 1  # Ledger and entry ids are signed 64-bit, as in BookKeeper.


class FiniteFloat(click.FloatRange):
    """click's FloatRange that refuses nan and inf: the type of every float option of `bkaio`.

    float() reads "nan" and "inf"; NaN passes every bound (each comparison with it is false)
    and reaches the library as a timeout asyncio cannot schedule, infinity waits forever."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


class Int(click.IntRange):
    """click's IntRange, bounded above (by 2^63 - 1 unless less): the type of every integer
    option of `bkaio`. Unbounded, a huge number went through to the library (a namespace's
    `--quota-bytes 10**23` ended in msgpack with a traceback). Named "integer": a non-number
    reads "'x' is not a valid integer." (IntRange's name, "integer range", misleads)."""

    name = "integer"

    def __init__(self, min: int | None = None, max: int = MAX_ID) -> None:
        super().__init__(min, max)


LEDGER_ID = Int(0)
ENTRY_ID = Int(0)
POSITIVE_INT = Int(1)
# `simpletest` and `bookiesanity` append one entry at a time and keep one latency each: a
# million takes minutes and tens of MB; with no bound a mistyped count ate the host's memory.
MAX_TEST_ENTRIES = 1_000_000
TEST_ENTRIES = Int(1, MAX_TEST_ENTRIES)
POSITIVE_SECONDS = FiniteFloat(min=0, min_open=True)


class BookieIdType(click.ParamType):  # type: ignore[type-arg]  # generic only in click>=8.2
    """`host:port`, the form bookie ids take (port 1..65535, no '/')."""

    name = "BOOKIE_ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        host, _, port = text.rpartition(":")
        if (
            not host
            or "/" in text
            or not text.isprintable()
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            self.fail(f"{value!r} is not a bookie id (host:port, e.g. 10.0.0.7:3181)", param, ctx)
        return text


class MetadataUriType(click.ParamType):  # type: ignore[type-arg]  # generic only in click>=8.2
    """etcd://host:port[,host:port]/prefix or sqlite:///absolute/path.db, parsed up front."""

    name = "URI"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from bkaio.errors import ConfigError
        from bkaio.meta.uri import parse_etcd_uri, parse_sqlite_uri

        text = str(value).strip()
        scheme = text.partition("://")[0]
        parsers = {"etcd": parse_etcd_uri, "sqlite": parse_sqlite_uri}
        if scheme not in parsers:
            self.fail(
                f"{text!r}: want etcd://host:port/prefix or sqlite:///path/meta.db", param, ctx
            )
        try:
            parsers[scheme](text)
        except ConfigError as error:
            self.fail(str(error), param, ctx)
        return text


class InstanceIdType(click.ParamType):  # type: ignore[type-arg]  # generic only in click>=8.2
    """A new cluster's instance id: 1 to 64 ASCII letters, digits, '-', '_' or '.' (a UUID, with
    or without its dashes, as the random ones are). Cookies name it: an empty one reads as
    "stamped before clusters were named"."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not 0 < len(text) <= 64 or set(text) - INSTANCE_ID_CHARACTERS:
            self.fail(
                f"{value!r} is not an instance id (1 to 64 ASCII letters, digits, '-', '_', '.')",
                param,
                ctx,
            )
        return text


INSTANCE_ID_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-_.")
BOOKIE_ID = BookieIdType()
INSTANCE_ID = InstanceIdType()
METADATA_URI = MetadataUriType()


def check_range(first: int | None, last: int | None, *, what: str = "entry") -> None:
    """FIRST..LAST must not run backwards (a usage error, exit 2)."""
    if first is not None and last is not None and last < first:
        raise click.BadParameter(f"last {what} {last} is before first {what} {first}")


def split_stream_name(name: str, *, stream_required: bool) -> tuple[str, str | None]:
    """NS (unless `stream_required`) or NS/STREAM, each part a good name by the metadata's rules
    (`bkaio.meta.records.name_problem`: not empty, at most 255 characters, no '/', printable),
    else a usage error saying which rule it breaks. "ns/" is no name for namespace ns: `stream
    delete "ns/$STREAM" --force` with $STREAM empty must not delete the whole namespace."""
    namespace, slash, stream = name.partition("/")
    if stream_required and not slash:
        raise click.BadParameter(f"{name!r} is not NAMESPACE/STREAM")
    check_name_argument("namespace", namespace, whole=name)
    if not slash:
        return namespace, None
    check_name_argument("stream", stream, whole=name)
    return namespace, stream


def check_name_argument(kind: str, name: str, *, whole: str | None = None) -> str:
    """`name` as a `kind` name ("namespace", "stream", "cursor"), or a usage error (exit 2)
    saying which rule it breaks, quoting `whole` (the argument it came from) when given."""
    from bkaio.meta.records import name_problem

    problem = name_problem(kind, name)
    if problem is not None:
        raise click.BadParameter(problem if whole is None else f"{whole!r}: {problem}")
    return name


def name_argument(kind: str) -> Any:
    """A click callback checking a `kind` name argument or option (None passes)."""

    def callback(context: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, tuple):  # nargs=-1
            return tuple(check_name_argument(kind, item) for item in value)
        return check_name_argument(kind, value)

    return callback


def stream_position(context: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: `value` must be a seq, LEDGER:ENTRY@SEQ with each field in
    [0, 2^63), or (for --from) earliest or latest; returned unchanged, the command parses it.
    The message names every form the option takes."""
    from bkaio.errors import BKError
    from bkaio.stream import StreamPosition

    if value is None or str(value).isdigit():
        return value
    start = param.name == "start"
    if value in ("earliest", "latest") and start:
        return value
    try:
        position = StreamPosition.parse(str(value))
    except BKError:
        position = None
    fields = () if position is None else (position.ledger_id, position.entry_id, position.seq)
    if position is None or not all(0 <= field <= MAX_ID for field in fields):
        wanted = "earliest, latest, a seq" if start else "a seq"
        raise click.BadParameter(
            f"{value!r} is not {wanted} or LEDGER:ENTRY@SEQ (for example 12:0@4000; "
            f"each a whole number in [0, {MAX_ID}])"
        )
    return value
