"""The bookie's configuration: the ONE place that reads TOML and `BKAIO_*` environment overrides.

    [bookie]     identity and address: bookie_id, host, port, advertised_host, shards, rack
    [metadata]   uri, registration_ttl_seconds
    [server]     connection limits and deadlines
    [admin]      admin HTTP (host, port, token)
    [read_only]  disk thresholds, disk check interval, start read-only
    [autorecovery] the auditor and replication worker this bookie runs (docs/autorecovery.md)
    [gc]         garbage collection of deleted and moved ledgers, compaction cadence
    [tls]        TLS (and mutual TLS) on the client port
    [scrub]      the background consistency check of stored entries (off by default)
    [storage]    journal_dirs, ledger_dirs, index_dirs and the other `StorageConfig` knobs
    [journal]    the `JournalConfig` knobs except its directory
    [log]        level, json

Every key may be overridden by `BKAIO_<SECTION>_<KEY>` (upper case), e.g. `BKAIO_BOOKIE_PORT=3181`
or `BKAIO_STORAGE_LEDGER_DIRS=/d1,/d2`. An unknown key, in the file or in a `BKAIO_<SECTION>_`
variable of a known section, is a `ConfigError` naming it.

Typing is msgspec's: the file is converted (strictly: `enabled = 1` is not a boolean) into one
struct per section whose fields are the dataclasses' own fields and types, environment values
leniently (strings to numbers and booleans). This module only shapes the input (comma lists,
yes/no) and words msgspec's errors with the file or variable, the key and the value.

Each component gets its own frozen branch: a shard worker gets `config.storage[shard_index]`, a
`StorageConfig` whose journal, ledger and index directories are that shard's own subdirectories
(`<dir>/shard-<i>`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bkaio.entrylog.config import StorageConfig
from bkaio.errors import ConfigError
from bkaio.journal import JournalConfig

ENV_PREFIX = "BKAIO_"
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieSection:
    bookie_id: str = ""  # Empty: derived as "<advertised_host>:<port>".
    host: str = "0.0.0.0"  # Listening address of every shard.
    port: int = 3181  # Shard i listens on port + i.
    advertised_host: str = ""  # Empty: host, or this machine's name when host is a wildcard.
    shards: int = 0  # 0: one shard per CPU core.
    rack: str = "/default-rack"

    def __post_init__(self) -> None:
        if not 0 < self.port <= 65535:
            raise ConfigError(f"bookie.port={self.port} must be in [1, 65535]")
        if not 0 <= self.shards <= 1024:
            raise ConfigError(f"bookie.shards={self.shards} must be in [0, 1024] (0 = CPU count)")
        if not self.rack.startswith("/"):
            raise ConfigError(f"bookie.rack={self.rack!r} must start with '/' (e.g. /dc1/rack1)")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataSection:
    uri: str = "etcd://127.0.0.1:2379/bkaio"
    registration_ttl_seconds: float = 10.0  # Lease TTL: a dead bookie vanishes after this.

    def __post_init__(self) -> None:
        if "://" not in self.uri:
            raise ConfigError(f"metadata.uri={self.uri!r} must be etcd://... or sqlite:///...")
        if not 1.0 <= self.registration_ttl_seconds <= 3600.0:
            raise ConfigError(
                f"metadata.registration_ttl_seconds={self.registration_ttl_seconds} "
                "must be in [1, 3600]"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    max_frame_bytes: int = 8 * 1024 * 1024  # One 8 MiB entry plus envelope.
    max_inflight_per_connection: int = 10_000  # Past this, the connection stops being read.
    max_connections: int = 4096  # Per shard; more are closed at once.
    max_memory_bytes: int = (
        512 * 1024 * 1024
    )  # Per shard: request bytes in flight, all connections.
    hello_timeout_seconds: float = 10.0  # A connection must send HELLO within this.
    frame_read_timeout_seconds: float = 30.0  # A started frame must complete within this.
    idle_timeout_seconds: float = 600.0  # A connection with nothing in flight is closed after this.
    max_long_poll_waiters: int = 10_000  # Per shard; more long polls get TOO_MANY_REQUESTS.
    max_long_poll_waiters_per_connection: int = 1000  # ... and per connection, likewise.
    max_read_range_count: int = 10_000  # READ_RANGE answers at most this many entries.
    max_read_range_bytes: int = 4 * 1024 * 1024  # ... and at most this many payload bytes.
    drain_timeout_seconds: float = 10.0  # SIGTERM: in-flight requests get this long to finish.
    auth_token: str = ""  # Non-empty: HELLO must carry this token.
    # A refused HELLO is answered after this delay, doubled per recent failure from the same
    # host up to the max: guessing tokens gets slow, honest clients see one short pause.
    auth_failure_delay_seconds: float = 0.25
    auth_failure_max_delay_seconds: float = 5.0
    # One entry's payload; the frame adds a small envelope. More is a broken or hostile client.
    max_entry_bytes: int = 8 * 1024 * 1024 - 4096
    # Unsent response bytes per connection before it stops being read (a client that does not
    # read its responses cannot make the bookie buffer without bound).
    write_buffer_high_bytes: int = 4 * 1024 * 1024
    # "metadata": the first key a bookie sees for a ledger must match the ledger's metadata
    # (password hash), so nobody can squat or fence a ledger by guessing its id.
    # "first_sight": BookKeeper's rule, the first key wins (trusted networks, raw tools).
    ledger_key_check: str = "metadata"
    ledger_key_cache_entries: int = 65_536  # Ledgers whose metadata key hash is kept in memory.

    def __post_init__(self) -> None:
        positive_ints = (
            "max_frame_bytes",
            "max_inflight_per_connection",
            "max_connections",
            "max_memory_bytes",
            "max_long_poll_waiters",
            "max_long_poll_waiters_per_connection",
            "max_read_range_count",
            "max_read_range_bytes",
            "max_entry_bytes",
            "write_buffer_high_bytes",
            "ledger_key_cache_entries",
        )
        for name in positive_ints:
            if getattr(self, name) <= 0:
                raise ConfigError(f"server.{name}={getattr(self, name)} must be > 0")
        positive_floats = (
            "hello_timeout_seconds",
            "frame_read_timeout_seconds",
            "idle_timeout_seconds",
            "drain_timeout_seconds",
        )
        for name in positive_floats:
            if getattr(self, name) <= 0:
                raise ConfigError(f"server.{name}={getattr(self, name)} must be > 0")
        if not 0 <= self.auth_failure_delay_seconds <= self.auth_failure_max_delay_seconds:
            raise ConfigError(
                f"server.auth_failure_delay_seconds={self.auth_failure_delay_seconds} must be in "
                f"[0, server.auth_failure_max_delay_seconds={self.auth_failure_max_delay_seconds}]"
            )
        if self.ledger_key_check not in ("metadata", "first_sight"):
            raise ConfigError(
                f"server.ledger_key_check={self.ledger_key_check!r} must be metadata|first_sight"
            )
        if self.max_memory_bytes < self.max_frame_bytes:
            raise ConfigError(
                f"server.max_memory_bytes={self.max_memory_bytes} must be >= "
                f"server.max_frame_bytes={self.max_frame_bytes} (one frame must fit)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    """The [tls] section: TLS on the bookie's client port (docs/security.md)."""

    enabled: bool = False
    cert_file: str = ""  # PEM certificate chain of this bookie (its host/IP in the SAN).
    key_file: str = ""  # PEM private key of cert_file.
    ca_file: str = ""  # PEM CAs that sign client certificates (mutual TLS).
    require_client_cert: bool = False  # Mutual TLS: refuse clients without a valid certificate.
    min_version: str = "1.2"  # "1.2" or "1.3".
    # When this bookie is itself a client of other bookies (autorecovery): CAs that sign bookie
    # certificates (empty: ca_file, then the system store) and an optional client certificate.
    client_ca_file: str = ""
    client_cert_file: str = ""
    client_key_file: str = ""

    def __post_init__(self) -> None:
        if self.min_version not in ("1.2", "1.3"):
            raise ConfigError(f"tls.min_version={self.min_version!r} must be 1.2 or 1.3")
        if self.enabled and not (self.cert_file and self.key_file):
            raise ConfigError("tls.enabled needs tls.cert_file and tls.key_file")
        if self.require_client_cert and not self.ca_file:
            raise ConfigError("tls.require_client_cert needs tls.ca_file (the clients' CA)")
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ConfigError("tls.client_cert_file and tls.client_key_file go together")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminConfig:
    enabled: bool = True
    host: str = "127.0.0.1"  # Loopback by default: the admin API is not for the open network.
    port: int = 8180  # 0: any free port (tests).
    token: str = ""  # Bearer token for PUT endpoints; empty disables them.

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"admin.port={self.port} must be in [0, 65535]")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOnlyConfig:
    disk_check_interval_seconds: float = 10.0
    disk_warn_fraction: float = 0.90
    disk_read_only_fraction: float = 0.95  # Any disk above this: the shard turns read-only.
    disk_writable_fraction: float = 0.90  # Back to writable once every disk is below this.
    start_read_only: bool = False

    def __post_init__(self) -> None:
        if self.disk_check_interval_seconds <= 0:
            raise ConfigError(
                f"read_only.disk_check_interval_seconds={self.disk_check_interval_seconds} "
                "must be > 0"
            )
        if not (
            0.0 < self.disk_writable_fraction <= self.disk_read_only_fraction <= 1.0
            and 0.0 < self.disk_warn_fraction <= self.disk_read_only_fraction
        ):
            raise ConfigError(
                f"read_only fractions must satisfy 0 < disk_writable_fraction "
                f"({self.disk_writable_fraction}) <= disk_read_only_fraction "
                f"({self.disk_read_only_fraction}) <= 1 and 0 < disk_warn_fraction "
                f"({self.disk_warn_fraction}) <= disk_read_only_fraction"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class AutorecoveryConfig:
    """The [autorecovery] section: what this process contributes to autorecovery."""

    enabled: bool = True  # Run a replication worker (and stand for auditor) in this bookie.
    auditor_enabled: bool = True  # Stand for auditor election.
    lost_bookie_delay_seconds: float = 30.0  # A bookie gone this long has its ledgers marked.
    audit_interval_seconds: float = 3600.0  # Periodic check of every ledger against the registry.
    ledger_check_interval_seconds: float = 86400.0  # Live bookies hold their entries? 0: never.
    auditor_lease_ttl_seconds: float = 10.0  # A dead auditor is replaced about this fast.
    worker_lease_ttl_seconds: float = 10.0  # Locks of a dead worker vanish after this.
    open_ledger_grace_seconds: float = 30.0  # An open ledger's writer gets this long to move off.
    retry_backoff_seconds: float = 5.0  # A ledger whose copy failed is retried after this...
    retry_backoff_max_seconds: float = 300.0  # ...growing (jittered) up to this.
    poll_interval_seconds: float = 5.0  # Idle worker re-checks the queue at least this often.
    worker_concurrency: int = 2  # Ledgers one worker re-replicates at the same time.
    entries_in_flight: int = 256  # Entries being copied at once per fragment.
    admin_token: str = ""  # Token for other bookies' admin HTTP; empty: this bookie's admin.token.

    def __post_init__(self) -> None:
        non_negative = (
            "lost_bookie_delay_seconds",
            "open_ledger_grace_seconds",
            "ledger_check_interval_seconds",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"autorecovery.{name}={getattr(self, name)} must be >= 0")
        positive = (
            "audit_interval_seconds",
            "auditor_lease_ttl_seconds",
            "worker_lease_ttl_seconds",
            "retry_backoff_seconds",
            "retry_backoff_max_seconds",
            "poll_interval_seconds",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"autorecovery.{name}={getattr(self, name)} must be > 0")
        for name in ("worker_concurrency", "entries_in_flight"):
            if not 1 <= getattr(self, name) <= 100_000:
                raise ConfigError(
                    f"autorecovery.{name}={getattr(self, name)} must be in [1, 100000]"
                )


@dataclass(frozen=True, slots=True, kw_only=True)
class GcConfig:
    """The [gc] section: each shard drops ledgers the metadata no longer places on it."""

    enabled: bool = True
    interval_seconds: float = 600.0  # Between scans (BookKeeper's gcWaitTime).
    # A ledger is collected only when absent from metadata in two scans at least this far
    # apart, so a ledger whose metadata lags its first entries is never collected.
    grace_seconds: float = 60.0
    # Ledgers still in metadata whose ensembles no longer name this bookie (moved away by
    # re-replication or decommission); 0 in overreplicated_grace_seconds means the same
    # two-scan rule with no extra wait.
    collect_overreplicated: bool = True
    overreplicated_grace_seconds: float = 3600.0
    compact_after_delete: bool = True  # Reclaim entry-log space right after a deletion.
    compaction_interval_seconds: float = 3600.0  # Compaction also runs at least this often.

    def __post_init__(self) -> None:
        for name in ("interval_seconds", "compaction_interval_seconds"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"gc.{name}={getattr(self, name)} must be > 0")
        for name in ("grace_seconds", "overreplicated_grace_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"gc.{name}={getattr(self, name)} must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrubConfig:
    """The [scrub] section: the background consistency check of every stored entry
    (BookKeeper's localScrubPeriod / localScrubRateLimit; docs/operations.md)."""

    period_seconds: float = 0.0  # Between the starts of two scrubs; 0 turns the scrubber off.
    rate_entries_per_second: float = 60.0  # Entries read and verified per second, per shard.

    def __post_init__(self) -> None:
        if self.period_seconds < 0:
            raise ConfigError(f"scrub.period_seconds={self.period_seconds} must be >= 0 (0: off)")
        if not 0 < self.rate_entries_per_second <= 1_000_000:
            raise ConfigError(
                f"scrub.rate_entries_per_second={self.rate_entries_per_second} must be in "
                "(0, 1000000]"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageDirs:
    """Where the shards' data lives; each shard uses `<dir>/shard-<i>` of each directory."""

    journal_dirs: tuple[Path, ...] = (Path("/var/lib/bkaio/journal"),)
    ledger_dirs: tuple[Path, ...] = (Path("/var/lib/bkaio/ledgers"),)
    index_dirs: tuple[Path, ...] = ()  # Empty: "index" next to each ledger dir's shard dir.

    def __post_init__(self) -> None:
        if not self.journal_dirs:
            raise ConfigError("storage.journal_dirs is empty: at least one directory is needed")
        if not self.ledger_dirs:
            raise ConfigError("storage.ledger_dirs is empty: at least one directory is needed")
        for name in ("journal_dirs", "ledger_dirs", "index_dirs"):
            for directory in getattr(self, name):
                if not directory.is_absolute():
                    raise ConfigError(f"storage.{name} entry {str(directory)!r} must be absolute")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    level: str = "info"
    json: bool = True

    def __post_init__(self) -> None:
        if self.level.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ConfigError(f"log.level={self.level!r} must be debug|info|warning|error|critical")


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieConfig:
    bookie_id: str  # Resolved: never empty.
    host: str
    port: int
    advertised_host: str  # Resolved: never empty.
    shard_count: int  # Resolved: never 0.
    rack: str
    metadata: MetadataSection
    server: ServerConfig
    admin: AdminConfig
    read_only: ReadOnlyConfig
    storage: tuple[StorageConfig, ...]  # One per shard, in shard order.
    log: LogConfig
    autorecovery: AutorecoveryConfig = field(default_factory=AutorecoveryConfig)
    gc: GcConfig = field(default_factory=GcConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    scrub: ScrubConfig = field(default_factory=ScrubConfig)
    source: Path | None = field(default=None, compare=False)  # The TOML file it came from.

    def __post_init__(self) -> None:
        assert self.bookie_id and self.advertised_host and self.shard_count > 0, self
        assert len(self.storage) == self.shard_count, (len(self.storage), self.shard_count)
        if self.port + self.shard_count - 1 > 65535:
            raise ConfigError(
                f"bookie.port={self.port} with {self.shard_count} shards needs ports up to "
                f"{self.port + self.shard_count - 1}, above 65535"
            )

    def shard_port(self, shard_index: int) -> int:
        assert 0 <= shard_index < self.shard_count, (shard_index, self.shard_count)
        return self.port + shard_index

    def shard_of(self, ledger_id: int) -> int:
        """The shard that owns `ledger_id`."""
        return ledger_id % self.shard_count


# The TOML sections that map 1:1 onto a dataclass (the journal and storage ones are merged).
_SECTIONS: dict[str, type[Any]] = {
    "bookie": BookieSection,
    "metadata": MetadataSection,
    "server": ServerConfig,
    "admin": AdminConfig,
    "read_only": ReadOnlyConfig,
    "log": LogConfig,
    "autorecovery": AutorecoveryConfig,
    "gc": GcConfig,
    "tls": TlsConfig,
    "scrub": ScrubConfig,
}
# Keys of StorageConfig/JournalConfig the bookie sets itself (directories, disk thresholds).
_STORAGE_OWN_KEYS = frozenset(
    {
        "journal",
        "ledger_dirs",
        "index_dirs",
        "disk_warn_fraction",
        "disk_read_only_fraction",
        "ledger_stride",
    }
)
_JOURNAL_DIR_KEYS = frozenset({"directory", "directories", "journal_dir", "journal_dirs"})


def _settable_fields(cls: type[Any], excluded: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Field name -> resolved type hint of the init fields of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and f.name not in excluded
    }


def _all_sections() -> dict[str, dict[str, Any]]:
    sections = {name: _settable_fields(cls) for name, cls in _SECTIONS.items()}
    storage = _settable_fields(StorageDirs)
    storage.update(_settable_fields(StorageConfig, _STORAGE_OWN_KEYS))
    sections["storage"] = storage
    sections["journal"] = _settable_fields(JournalConfig, _JOURNAL_DIR_KEYS)
    return sections


# --- decoding: msgspec does the typing; this module only names what went wrong ---------------

_SECTION_HINTS = _all_sections()
# The shape of a config file for msgspec: one struct per section whose fields are the section's
# keys, every one optional (UNSET: not in the file). Unknown sections and keys are refused.
_FILE_TYPE = msgspec.defstruct(
    "BookieConfigFile",
    [
        (
            section,
            msgspec.defstruct(
                f"{section}_section",
                [(key, hint, msgspec.UNSET) for key, hint in hints.items()],
                kw_only=True,
                forbid_unknown_fields=True,
            ),
            msgspec.UNSET,
        )
        for section, hints in _SECTION_HINTS.items()
    ],
    kw_only=True,
    forbid_unknown_fields=True,
)
# msgspec's type names in its errors, as this project words them.
_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true/false)",
    "str": "a string",
    "array": "a list",
    "object": "a table",
}
_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")
_EXPECTED_TYPE = re.compile(r"Expected `(?P<type>[^`|]*)[^`]*`, got `[^`]*`")
_PATH_PART = re.compile(r"\.(?P<name>\w+)|\[(?P<index>\d+)\]")


def _decode_path(hint: type, value: object) -> object:
    """msgspec's hook for the one type it does not know: a path, from a non-empty string."""
    if hint is Path:
        if isinstance(value, str) and value:
            return Path(value).expanduser()
        raise ValueError("must be a non-empty path string")
    raise NotImplementedError(hint)


def _config_error(where: str, error: msgspec.ValidationError, data: object) -> ConfigError:
    """`error` as a ConfigError naming the file (or variable), the key and the bad value."""
    match = _ERROR.match(str(error))
    assert match is not None
    what, path = match["what"], match["path"] or ""
    parts = [
        m["name"] if m["name"] is not None else int(m["index"]) for m in _PATH_PART.finditer(path)
    ]
    unknown = _UNKNOWN_FIELD.match(what)
    if unknown is not None and not parts:
        return ConfigError(
            f"{where}: unknown section [{unknown['key']}]; "
            f"known: {', '.join(sorted(_SECTION_HINTS))}"
        )
    if unknown is not None:
        section = str(parts[0])
        return ConfigError(
            f"{where}: unknown key {section}.{unknown['key']}; known keys of [{section}]: "
            f"{', '.join(sorted(_SECTION_HINTS[section]))}"
        )
    value: Any = data
    for part in parts:
        value = value[part]
    key = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in parts).lstrip(".")
    expected = _EXPECTED_TYPE.match(what)
    reason = f"must be {_EXPECTED.get(expected['type'], expected['type'])}" if expected else what
    if len(parts) == 1:
        return ConfigError(f"{where}: {key} must be a table ([{key}])")
    return ConfigError(f"{where}: {key}={value!r} {reason}")


def _decode_file(data: Mapping[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    """The file's values by section and key, each of its field's type (msgspec, strict)."""
    shaped = {
        section: {
            key: [value] if isinstance(value, str) and _is_tuple(section, key) else value
            for key, value in table.items()
        }
        if isinstance(table, dict)
        else table
        for section, table in data.items()
    }  # A single string where a list is wanted is a list of one.
    try:
        decoded = msgspec.convert(shaped, _FILE_TYPE, dec_hook=_decode_path)
    except msgspec.ValidationError as error:
        raise _config_error(origin, error, shaped) from None
    merged: dict[str, dict[str, Any]] = {}
    for section in _SECTION_HINTS:
        table = getattr(decoded, section)
        merged[section] = {} if table is msgspec.UNSET else {
            key: getattr(table, key)
            for key in _SECTION_HINTS[section]
            if getattr(table, key) is not msgspec.UNSET
        }  # fmt: skip
    return merged


def _is_tuple(section: str, key: str) -> bool:
    hint = _SECTION_HINTS.get(section, {}).get(key)
    return typing.get_origin(hint) is tuple


def _decode_env_value(variable: str, hint: Any, text: str) -> Any:
    """One `BKAIO_<SECTION>_<KEY>` value as its field's type: msgspec in lax mode (strings to
    numbers and booleans), after the spellings environments use (comma lists, yes/no, none)."""
    value: Any = text.strip()
    optional = typing.get_origin(hint) in (types.UnionType, typing.Union)
    if optional and value.lower() in {"", "none"}:
        return None
    inner = (
        next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    )
    if typing.get_origin(inner) is tuple:
        value = [item.strip() for item in value.split(",") if item.strip()]
    elif inner is bool:
        value = _ENV_BOOLEANS.get(value.lower(), value)
    elif inner is int:
        value = value.replace("_", "")
    try:
        return msgspec.convert(value, hint, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as error:
        match = _EXPECTED_TYPE.match(_ERROR.match(str(error))["what"])  # type: ignore[index]
        reason = f"must be {_EXPECTED.get(match['type'], match['type'])}" if match else str(error)
        raise ConfigError(f"environment {variable}={text!r} {reason}") from None


_ENV_BOOLEANS = {"yes": "true", "on": "true", "no": "false", "off": "false"}


def _merge_sources(
    data: Mapping[str, Any], env: Mapping[str, str], origin: str
) -> dict[str, dict[str, Any]]:
    """Every section's typed values: the file's, then the environment's over them."""
    merged = _decode_file(data, origin)
    # Longest section name first, so BKAIO_READ_ONLY_X is never read as section "read".
    by_length = sorted(_SECTION_HINTS, key=len, reverse=True)
    for variable, value in env.items():
        if not variable.startswith(ENV_PREFIX):
            continue
        rest = variable[len(ENV_PREFIX) :].lower()
        for section_name in by_length:
            if rest.startswith(section_name + "_"):
                key = rest[len(section_name) + 1 :]
                hints = _SECTION_HINTS[section_name]
                if key not in hints:
                    raise ConfigError(
                        f"environment: {variable} names unknown key {section_name}.{key}; known "
                        f"keys of [{section_name}]: {', '.join(sorted(hints))}"
                    )
                merged[section_name][key] = _decode_env_value(variable, hints[key], value)
                break
    return merged


def _shard_storage(
    dirs: StorageDirs,
    storage_options: Mapping[str, Any],
    journal_options: Mapping[str, Any],
    read_only: ReadOnlyConfig,
    shard_index: int,
    shard_count: int,
) -> StorageConfig:
    shard_dir = f"shard-{shard_index}"
    journal_dir = dirs.journal_dirs[shard_index % len(dirs.journal_dirs)] / shard_dir
    ledger_dirs = tuple(d / shard_dir for d in dirs.ledger_dirs)
    if dirs.index_dirs:
        index_dirs = tuple(d / shard_dir for d in dirs.index_dirs)
    else:
        index_dirs = tuple(d / shard_dir / "index" for d in dirs.ledger_dirs)
        ledger_dirs = tuple(d / "entrylog" for d in ledger_dirs)
    journal = JournalConfig(**_journal_dir_kwargs(journal_dir), **journal_options)
    return StorageConfig(
        journal=journal,
        ledger_dirs=ledger_dirs,
        index_dirs=index_dirs,
        disk_warn_fraction=read_only.disk_warn_fraction,
        disk_read_only_fraction=read_only.disk_read_only_fraction,
        ledger_stride=shard_count,
        **storage_options,
    )


def _journal_dir_kwargs(journal_dir: Path) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(JournalConfig)}
    if "directory" in names:
        return {"directory": journal_dir}
    assert "directories" in names, names
    return {"directories": (journal_dir,)}


def build_bookie_config(
    data: Mapping[str, Any], env: Mapping[str, str] = os.environ, *, source: Path | None = None
) -> BookieConfig:
    """A validated `BookieConfig` from parsed TOML `data` and environment overrides."""
    origin = str(source) if source is not None else "config"
    merged = _merge_sources(data, env, origin)
    try:
        bookie = BookieSection(**merged["bookie"])
        metadata = MetadataSection(**merged["metadata"])
        server = ServerConfig(**merged["server"])
        admin = AdminConfig(**merged["admin"])
        read_only = ReadOnlyConfig(**merged["read_only"])
        log = LogConfig(**merged["log"])
        autorecovery = AutorecoveryConfig(**merged["autorecovery"])
        gc = GcConfig(**merged["gc"])
        tls = TlsConfig(**merged["tls"])
        scrub = ScrubConfig(**merged["scrub"])
        dir_keys = set(_settable_fields(StorageDirs))
        dirs = StorageDirs(**{k: v for k, v in merged["storage"].items() if k in dir_keys})
        storage_options = {k: v for k, v in merged["storage"].items() if k not in dir_keys}
        shard_count = bookie.shards or os.cpu_count() or 1
        storage = tuple(
            _shard_storage(
                dirs, storage_options, merged["journal"], read_only, shard_index, shard_count
            )
            for shard_index in range(shard_count)
        )
        advertised_host = bookie.advertised_host or (
            socket.getfqdn() if bookie.host in _WILDCARD_HOSTS else bookie.host
        )
        return BookieConfig(
            bookie_id=bookie.bookie_id or f"{advertised_host}:{bookie.port}",
            host=bookie.host,
            port=bookie.port,
            advertised_host=advertised_host,
            shard_count=shard_count,
            rack=bookie.rack,
            metadata=metadata,
            server=server,
            admin=admin,
            read_only=read_only,
            storage=storage,
            log=log,
            autorecovery=autorecovery,
            gc=gc,
            tls=tls,
            scrub=scrub,
            source=source,
        )
    except ConfigError as error:
        raise ConfigError(f"{origin}: {error}") from error


def load_bookie_config(path: Path | str, env: Mapping[str, str] = os.environ) -> BookieConfig:
    """Read the TOML file at `path`, apply `BKAIO_<SECTION>_<KEY>` overrides, validate."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except FileNotFoundError as error:
        raise ConfigError(f"bookie config {path} does not exist") from error
    except OSError as error:
        raise ConfigError(f"bookie config {path} cannot be read: {error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"bookie config {path} is not valid TOML: {error}") from error
    return build_bookie_config(data, env, source=path)
