"""Option parsing for `format("bkaio")`: Spark's string options into typed, frozen settings.

Spark hands options over as a case-insensitive map of strings (keys arrive lower-cased). This
module turns them into `ReadOptions` / `WriteOptions`, refusing unknown keys, malformed values
and contradictory combinations with a `SparkOptionError` that names the option. Pure: no I/O,
no pyspark import.

Read options (docs/spark.md has the full table):
    metadata (alias serviceUri)           metadata URI: etcd://host:2379/bkaio or sqlite:///path
    stream | streams | streamsPattern | ledgers | load(path)    what to read (exactly one)
    startingOffsets (alias startingPosition), endingOffsets       earliest | latest | JSON
    maxEntriesPerPartition, maxBytesPerPartition, minPartitions   partition planning
    maxEntriesPerTrigger, maxBytesPerTrigger                      streaming rate limits
    failOnDataLoss, password (ledgers only), batchEntries, bkaio.client.<ClientConfig field>
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import structlog

from bkaio.errors import ConfigError
from bkaio.ledger_client.types import CONFIG_FIELD_KINDS, ClientConfig
from bkaio.meta.ledger_metadata import MAX_LEDGER_ID
from bkaio.meta.uri import shown_uri
from bkaio.spark.errors import SparkOptionError

log = structlog.get_logger(__name__)

EARLIEST: Final = "earliest"
LATEST: Final = "latest"
EARLIEST_SEQ = -2  # Kafka's convention inside JSON offsets.
LATEST_SEQ = -1

# A per-stream bound: a seq, or where to find one (earliest/latest or a ledger position).
StreamBound = int | tuple[int, int]  # seq (>= 0, or EARLIEST_SEQ/LATEST_SEQ) | (ledger, entry)
OffsetSpec = Literal["earliest", "latest"] | dict[str, StreamBound]

DEFAULT_MAX_ENTRIES_PER_PARTITION = 1_000_000
DEFAULT_MAX_BYTES_PER_PARTITION = 64 << 20
# Rows per Arrow record batch a reader yields: entries per range request to one bookie (so
# E times as many per batch of a striped ledger, whose batches take one request per bookie).
DEFAULT_BATCH_ENTRIES = 4096
# minPartitions above this is refused: planning costs time and the driver memory in proportion
# to the partitions (100,000 plan in seconds), and Spark schedules a task for each.
MAX_MIN_PARTITIONS = 100_000

CLIENT_PREFIX = "bkaio.client."

_READ_KEYS = {
    "metadata",
    "serviceuri",
    "path",
    "stream",
    "streams",
    "streamspattern",
    "ledgers",
    "startingoffsets",
    "startingposition",
    "endingoffsets",
    "maxentriesperpartition",
    "maxbytesperpartition",
    "minpartitions",
    "maxentriespertrigger",
    "maxbytespertrigger",
    "failondataloss",
    "password",
    "batchentries",
}
_WRITE_KEYS = {
    "metadata",
    "serviceuri",
    "path",
    "stream",
    "payloadcolumn",
    "ensemblesize",
    "writequorum",
    "ackquorum",
    "sinkid",
    "checkpointlocation",
    "batchentries",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    """What to read and how to split it (batch and streaming)."""

    metadata: str
    streams: tuple[str, ...] = ()  # "namespace/stream", exact names.
    streams_pattern: str | None = None  # A regex matched in full against "namespace/stream".
    ledgers: tuple[int, ...] = ()  # Raw ledgers (no stream, seq is null).
    starting: OffsetSpec = EARLIEST
    ending: OffsetSpec = LATEST
    max_entries_per_partition: int = DEFAULT_MAX_ENTRIES_PER_PARTITION
    max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION
    min_partitions: int = 0
    max_entries_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    password: bytes = b""
    batch_entries: int = DEFAULT_BATCH_ENTRIES
    client: dict[str, Any] = field(default_factory=dict)

    @property
    def reads_streams(self) -> bool:
        return not self.ledgers


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOptions:
    """Where a sink appends and how it creates its ledgers."""

    metadata: str
    namespace: str
    stream: str
    payload_column: str | None = None  # None: "payload", else "value", else the only column.
    ensemble_size: int | None = None  # None: the namespace's settings.
    write_quorum: int | None = None
    ack_quorum: int | None = None
    sink_id: str | None = None  # Streaming: names the query so a replayed batch is not re-added.
    batch_entries: int = 1024  # Appends in flight per task before waiting for their acks.
    client: dict[str, Any] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        return f"{self.namespace}/{self.stream}"


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in options.items()}


def _check_keys(options: dict[str, str], known: set[str], what: str) -> None:
    unknown = sorted(k for k in options if k not in known and not k.startswith(CLIENT_PREFIX))
    if unknown:
        raise SparkOptionError(
            f"bkaio {what}: unknown option(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(known))} and {CLIENT_PREFIX}<field>"
        )


def _metadata(options: dict[str, str], what: str) -> str:
    uri = options.get("metadata") or options.get("serviceuri")
    if not uri:
        raise SparkOptionError(
            f"bkaio {what}: option 'metadata' is required (the metadata URI, for example "
            "etcd://127.0.0.1:2379/bkaio or sqlite:///var/lib/bkaio/meta.db)"
        )
    if "://" not in uri:
        shown = shown_uri(uri)
        raise SparkOptionError(f"bkaio {what}: metadata={shown!r} is not a URI (scheme://...)")
    return uri


def _int(options: dict[str, str], key: str, default: int, *, minimum: int) -> int:
    text = options.get(key)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SparkOptionError(f"option {key}={text!r} is not an integer") from None
    if value < minimum:
        raise SparkOptionError(f"option {key}={value} must be >= {minimum}")
    return value


def _optional_int(options: dict[str, str], key: str) -> int | None:
    if key not in options:
        return None
    return _int(options, key, 0, minimum=1)


def _bool(options: dict[str, str], key: str, default: bool) -> bool:
    text = options.get(key)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {key}={text!r} must be true or false")


def split_stream_name(name: str, key: str = "stream") -> tuple[str, str]:
    """'namespace/stream' into its two parts (SparkOptionError when it is not that shape)."""
    namespace, slash, stream = name.strip().partition("/")
    if not slash or not namespace or not stream or "/" in stream:
        raise SparkOptionError(
            f"option {key}: {name!r} is not 'namespace/stream' (for example tenant-a/orders)"
        )
    return namespace, stream


# (kind, optional) of every ClientConfig field, from its declared type (a field whose default
# is None, auth_token: str | None, is typed by its annotation, not its default).
_CLIENT_FIELDS: Final = CONFIG_FIELD_KINDS


def _client_value(options: dict[str, str], key: str, kind: type, optional: bool) -> Any:
    text = options[key]
    # A string field takes the text as given (a token may well be "none"); other optional
    # fields spell their default None as "none".
    if kind is str:
        return text
    if optional and text.strip().lower() == "none":
        return None
    if kind is bool:
        return _bool(options, key, False)
    # Every ClientConfig field is a str, bool, int or float (types.CONFIG_FIELD_KINDS checks).
    try:
        value = kind(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):  # Refused here: NaN would pass ClientConfig's "x < 0" checks.
        raise SparkOptionError(
            f"option {key}={text!r} is not {'an integer' if kind is int else 'a number'}"
            + (" (or none)" if optional else "")
        )
    return value


def _client_options(options: dict[str, str]) -> dict[str, Any]:
    """`bkaio.client.<field>` options, each converted to the declared type of its ClientConfig
    field, and checked together by building the ClientConfig now: a bad value fails when the
    query is planned, naming the option, rather than when an executor connects."""
    result: dict[str, Any] = {}
    for key in options:
        if not key.startswith(CLIENT_PREFIX):
            continue
        name = key[len(CLIENT_PREFIX) :]
        if name not in _CLIENT_FIELDS:
            known = ", ".join(_CLIENT_FIELDS)
            raise SparkOptionError(
                f"option {key}: {name!r} is not a client setting; known: {known}"
            )
        result[name] = _client_value(options, key, *_CLIENT_FIELDS[name])
    try:
        ClientConfig(**result)
    except ConfigError as error:
        # The message names the field(s) at fault; name the options that set them.
        named = [name for name in result if re.search(rf"\b{name}\b", str(error))]
        keys = ", ".join(f"{CLIENT_PREFIX}{name}" for name in named or result)
        raise SparkOptionError(f"option {keys}: {error}") from None
    return result


def parse_offsets(text: str | None, key: str, default: OffsetSpec) -> OffsetSpec:
    """earliest | latest | JSON: {"ns/stream": seq | -2 | -1 | {"seq": n} | {"ledgerId": L,
    "entryId": E}}; -2 is earliest and -1 latest (as in Kafka's connector)."""
    if text is None:
        return default
    stripped = text.strip()
    if stripped.lower() in (EARLIEST, LATEST):
        return EARLIEST if stripped.lower() == EARLIEST else LATEST
    try:
        value = json.loads(stripped)
    except ValueError as error:
        raise SparkOptionError(
            f"option {key}={text!r} is neither earliest, latest nor JSON: {error}"
        ) from None
    if not isinstance(value, dict) or not value:
        raise SparkOptionError(f"option {key}: JSON offsets must be a non-empty object")
    bounds: dict[str, StreamBound] = {}
    for name, bound in value.items():
        split_stream_name(name, key)
        bounds[name] = _parse_bound(key, name, bound)
    return bounds


def _parse_bound(key: str, name: str, bound: Any) -> StreamBound:
    where = f"option {key}: stream {name!r}"
    if isinstance(bound, bool):
        raise SparkOptionError(f"{where}: {bound!r} is not a position")
    if isinstance(bound, int):
        if bound < EARLIEST_SEQ:
            raise SparkOptionError(f"{where}: seq {bound} (use >= 0, -2 earliest, -1 latest)")
        return bound
    if isinstance(bound, dict):
        lowered = {str(k).lower().replace("_", ""): v for k, v in bound.items()}
        if isinstance(lowered.get("seq"), int) and lowered["seq"] >= 0:
            return int(lowered["seq"])
        ledger_id, entry_id = lowered.get("ledgerid"), lowered.get("entryid")
        if isinstance(ledger_id, int) and isinstance(entry_id, int) and entry_id >= 0:
            return (ledger_id, entry_id)
    raise SparkOptionError(
        f'{where}: {bound!r} is not a position; use a seq, -2, -1, {{"seq": N}} or '
        '{"ledgerId": L, "entryId": E}'
    )


def parse_read_options(raw: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Typed read options from Spark's option map (SparkOptionError on bad input)."""
    what = "readStream" if streaming else "read"
    options = _lower(raw)
    _check_keys(options, _READ_KEYS, what)
    chosen = [k for k in ("stream", "streams", "streamspattern", "ledgers", "path") if k in options]
    if len(chosen) != 1:
        raise SparkOptionError(
            f"bkaio {what}: give exactly one of stream, streams, streamsPattern, ledgers "
            f"(or load('namespace/stream')); got {chosen or 'none'}"
        )
    source = chosen[0]
    streams: tuple[str, ...] = ()
    pattern: str | None = None
    ledgers: tuple[int, ...] = ()
    if source in ("stream", "path"):
        split_stream_name(options[source], source)
        streams = (options[source].strip(),)
    elif source == "streams":
        streams = tuple(n.strip() for n in options["streams"].split(",") if n.strip())
        if not streams:
            raise SparkOptionError("option streams: empty list")
        for name in streams:
            split_stream_name(name, "streams")
    elif source == "streamspattern":
        pattern = options["streamspattern"]
        try:
            re.compile(pattern)
        except re.error as error:
            raise SparkOptionError(f"option streamsPattern={pattern!r}: {error}") from None
    else:
        if streaming:
            raise SparkOptionError("bkaio readStream: reads streams, not raw ledgers")
        try:
            ledgers = tuple(int(p) for p in options["ledgers"].split(",") if p.strip())
        except ValueError:
            raise SparkOptionError(
                f"option ledgers={options['ledgers']!r} must be comma-separated ledger ids"
            ) from None
        if not ledgers:
            raise SparkOptionError(f"option ledgers={options['ledgers']!r}: no ledger id")
        outside = [i for i in ledgers if not 0 <= i <= MAX_LEDGER_ID]
        if outside:
            raise SparkOptionError(
                f"option ledgers: {', '.join(map(str, outside))} outside [0, 2**63 - 1] "
                "(ledger ids are signed 64-bit)"
            )
        # Refused rather than dropped: a repeated id is more likely a typo for another ledger
        # than a wish to read one twice, and reading it twice would double its rows.
        repeated = sorted(i for i, count in Counter(ledgers).items() if count > 1)
        if repeated:
            raise SparkOptionError(
                f"option ledgers: {', '.join(map(str, repeated))} given more than once"
            )
    if "password" in options and not ledgers:
        raise SparkOptionError(
            f"bkaio {what}: option password applies to raw ledgers only; the ledgers of "
            "streams are read with the stream password"
        )
    starting_key = "startingoffsets" if "startingoffsets" in options else "startingposition"
    starting = parse_offsets(options.get(starting_key), starting_key, EARLIEST)
    ending = parse_offsets(options.get("endingoffsets"), "endingoffsets", LATEST)
    if streaming and "endingoffsets" in options:
        raise SparkOptionError("bkaio readStream: endingOffsets applies to batch reads only")
    if ledgers and ("startingoffsets" in options or "endingoffsets" in options):
        raise SparkOptionError(
            "bkaio read: startingOffsets/endingOffsets apply to streams; ledgers are read whole"
        )
    if not streaming:
        for key in ("maxentriespertrigger", "maxbytespertrigger"):
            if key in options:  # As Spark's Kafka source does: a warning, not an error.
                log.warning(
                    "spark_read_option_ignored", option=key, reason="applies to readStream only"
                )
    min_partitions = _int(options, "minpartitions", 0, minimum=0)
    if min_partitions > MAX_MIN_PARTITIONS:
        raise SparkOptionError(
            f"option minPartitions={min_partitions} is above {MAX_MIN_PARTITIONS:,}: each "
            "partition is a Spark task planned on the driver; use maxEntriesPerPartition or "
            "maxBytesPerPartition for smaller partitions"
        )
    return ReadOptions(
        metadata=_metadata(options, what),
        streams=streams,
        streams_pattern=pattern,
        ledgers=ledgers,
        starting=starting,
        ending=ending,
        max_entries_per_partition=_int(
            options, "maxentriesperpartition", DEFAULT_MAX_ENTRIES_PER_PARTITION, minimum=1
        ),
        max_bytes_per_partition=_int(
            options, "maxbytesperpartition", DEFAULT_MAX_BYTES_PER_PARTITION, minimum=1
        ),
        min_partitions=min_partitions,
        max_entries_per_trigger=_optional_int(options, "maxentriespertrigger"),
        max_bytes_per_trigger=_optional_int(options, "maxbytespertrigger"),
        fail_on_data_loss=_bool(options, "failondataloss", True),
        password=options.get("password", "").encode(),
        batch_entries=_int(options, "batchentries", DEFAULT_BATCH_ENTRIES, minimum=1),
        client=_client_options(options),
    )


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """Typed sink options from Spark's option map (SparkOptionError on bad input)."""
    options = _lower(raw)
    _check_keys(options, _WRITE_KEYS, "write")
    name = options.get("stream") or options.get("path")
    if not name:
        raise SparkOptionError("bkaio write: option 'stream' (namespace/stream) is required")
    namespace, stream = split_stream_name(name)

    def quorum(key: str) -> int | None:
        return _optional_int(options, key)

    return WriteOptions(
        metadata=_metadata(options, "write"),
        namespace=namespace,
        stream=stream,
        payload_column=options.get("payloadcolumn"),
        ensemble_size=quorum("ensemblesize"),
        write_quorum=quorum("writequorum"),
        ack_quorum=quorum("ackquorum"),
        sink_id=options.get("sinkid") or options.get("checkpointlocation"),
        batch_entries=_int(options, "batchentries", 1024, minimum=1),
        client=_client_options(options),
    )
