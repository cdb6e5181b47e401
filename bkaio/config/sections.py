"""The bookie configuration's sections: one frozen dataclass per TOML section, each refusing
its own bad values with a `ConfigError` naming `section.key` (bkaio/config/__init__.py lists them).

These are the sections as the file gives them; `BookieConfig` (bookie_config.py) is the resolved
tree a bookie runs with, and decoding.py turns the file and the environment into their fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bkaio.errors import ConfigError
from bkaio.meta.uri import shown_uri

# Shared with the client: its entry limit, and the length of its tail's long-poll rounds.
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES, LONG_POLL_ROUND_SECONDS


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieSection:
    bookie_id: str = ""  # Empty: derived as "<advertised_host>:<port>".
    host: str = "0.0.0.0"  # Listening address of every shard.
    port: int = 3181  # Shard i listens on port + i.
    advertised_host: str = ""  # Empty: host, or this machine's name when host is a wildcard.
    shards: int = 0  # 0: one shard per CPU core.
    rack: str = "/default-rack"

    def __post_init__(self) -> None:
        if not self.host.strip():
            raise ConfigError(
                "bookie.host is empty: give the address to listen on (0.0.0.0 or :: for every "
                "interface)"
            )
        # The bookie id is a metadata key's last part (/bookies/writable/<bookie_id>): the
        # registration (BookieInfo) refuses a '/' in it, so it is refused here, before any start.
        for name in ("bookie_id", "advertised_host"):
            if "/" in getattr(self, name):
                raise ConfigError(
                    f"bookie.{name}={getattr(self, name)!r} must not contain '/' (the bookie id "
                    "is a metadata key)"
                )
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
            raise ConfigError(
                f"metadata.uri={shown_uri(self.uri)!r} must be etcd://... or sqlite:///..."
            )
        if not 1.0 <= self.registration_ttl_seconds <= 3600.0:
            raise ConfigError(
                f"metadata.registration_ttl_seconds={self.registration_ttl_seconds} "
                "must be in [1, 3600]"
            )


MIN_LONG_POLL_CAP_SECONDS: Final = LONG_POLL_ROUND_SECONDS  # max_long_poll_seconds's floor.


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
    # A long poll waits at most this long, whatever timeout its client asks for (up to ~49
    # days in a u32 of ms); a waiting poll keeps its connection from its idle timeout. The
    # client's own polls are 1 s rounds.
    max_long_poll_seconds: float = 60.0
    max_read_range_count: int = 10_000  # READ_RANGE answers at most this many entries.
    max_read_range_bytes: int = 4 * 1024 * 1024  # ... and at most this many payload bytes.
    drain_timeout_seconds: float = 10.0  # SIGTERM: in-flight requests get this long to finish.
    auth_token: str = ""  # Non-empty: HELLO must carry this token.
    # A refused HELLO is answered after this delay, doubled per recent failure from the same
    # host up to the max: guessing tokens gets slow, honest clients see one short pause.
    auth_failure_delay_seconds: float = 0.25
    auth_failure_max_delay_seconds: float = 5.0
    # One entry's payload; the frame adds a small envelope. More is a broken or hostile client.
    max_entry_bytes: int = 8 * 1024 * 1024 - FRAME_ENVELOPE_BYTES
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
            if not getattr(self, name) > 0:
                raise ConfigError(f"server.{name}={getattr(self, name)} must be > 0")
        positive_floats = (
            "hello_timeout_seconds",
            "frame_read_timeout_seconds",
            "idle_timeout_seconds",
            "drain_timeout_seconds",
            "max_long_poll_seconds",
        )
        for name in positive_floats:
            if not getattr(self, name) > 0:  # Written so that NaN fails it too.
                raise ConfigError(f"server.{name}={getattr(self, name)} must be > 0")
        if not self.max_long_poll_seconds >= MIN_LONG_POLL_CAP_SECONDS:
            # A client's tail round long-polls for LONG_POLL_ROUND_SECONDS and takes a round
            # answered in under half of that, with nothing new, for bookies that cannot wait
            # (a fenced ledger): it backs off. A lower cap would make every idle round look
            # like that, and tailing readers pause up to a second.
            raise ConfigError(
                f"server.max_long_poll_seconds={self.max_long_poll_seconds} must be >= "
                f"{MIN_LONG_POLL_CAP_SECONDS} (a client's long-poll round)"
            )
        if not 0 <= self.auth_failure_delay_seconds <= self.auth_failure_max_delay_seconds:
            raise ConfigError(
                f"server.auth_failure_delay_seconds={self.auth_failure_delay_seconds} must be in "
                f"[0, server.auth_failure_max_delay_seconds={self.auth_failure_max_delay_seconds}]"
            )
        if self.ledger_key_check not in ("metadata", "first_sight"):
            raise ConfigError(
                f"server.ledger_key_check={self.ledger_key_check!r} must be metadata|first_sight"
            )
        if self.max_entry_bytes > self.max_frame_bytes - FRAME_ENVELOPE_BYTES:
            raise ConfigError(
                f"server.max_entry_bytes={self.max_entry_bytes} must be <= "
                f"server.max_frame_bytes={self.max_frame_bytes} - {FRAME_ENVELOPE_BYTES}: an "
                "entry and its envelope must fit one frame"
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
        if self.require_client_cert and not self.enabled:
            # TLS off would serve plain TCP to any client: mutual TLS asked for, none given.
            raise ConfigError("tls.require_client_cert needs tls.enabled = true")
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ConfigError("tls.client_cert_file and tls.client_key_file go together")


ADMIN_TLS_MODES: Final = ("auto", "on", "off")


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminConfig:
    enabled: bool = True
    host: str = "127.0.0.1"  # Loopback by default: the admin API is not for the open network.
    port: int = 8180  # 0: any free port (tests).
    token: str = ""  # Bearer token for PUT endpoints; empty disables them.
    # HTTPS with the bookie's own certificate ([tls] cert_file/key_file): "auto" when
    # tls.enabled, "on" always (refused at start without tls.enabled), "off" plain HTTP.
    tls: str = "auto"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"admin.port={self.port} must be in [0, 65535]")
        if self.tls not in ADMIN_TLS_MODES:
            raise ConfigError(
                f"admin.tls={self.tls!r} must be auto|on|off (auto: HTTPS when tls.enabled)"
            )
        if not self.host.strip():
            # asyncio binds an empty host on every interface: the opposite of the default's
            # intent, and more likely an unset template variable than a choice ("0.0.0.0" is).
            raise ConfigError(
                "admin.host is empty; give an address (127.0.0.1 for this machine only, "
                "0.0.0.0 for every interface)"
            )


def admin_serves_https(admin: AdminConfig, tls: TlsConfig) -> bool:
    """Whether the admin HTTP serves HTTPS (with tls.cert_file and tls.key_file): admin.tls
    "on", or "auto" with tls.enabled. ConfigError for "on" without the bookie's TLS."""
    if admin.tls == "off":
        return False
    if admin.tls == "on" and not tls.enabled:
        raise ConfigError(
            'admin.tls = "on" needs tls.enabled = true with tls.cert_file and tls.key_file '
            '(the admin HTTPS serves the bookie\'s certificate); or set admin.tls = "off" '
            "for plain HTTP"
        )
    return tls.enabled


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOnlyConfig:
    disk_check_interval_seconds: float = 10.0
    disk_warn_fraction: float = 0.90
    disk_read_only_fraction: float = 0.95  # Any disk above this: the shard turns read-only.
    disk_writable_fraction: float = 0.90  # Back to writable once every disk is below this.
    start_read_only: bool = False

    def __post_init__(self) -> None:
        if not self.disk_check_interval_seconds > 0:
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
            if not getattr(self, name) >= 0:  # Written so that NaN fails it too.
                raise ConfigError(f"autorecovery.{name}={getattr(self, name)} must be >= 0")
        # As metadata.registration_ttl_seconds: a lease is refreshed every third of its TTL
        # and waited for (Lease.wait_confirmed) up to a TTL and a refresh attempt.
        for name in ("auditor_lease_ttl_seconds", "worker_lease_ttl_seconds"):
            if not 1.0 <= getattr(self, name) <= 3600.0:
                raise ConfigError(f"autorecovery.{name}={getattr(self, name)} must be in [1, 3600]")
        positive = (
            "audit_interval_seconds",
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
            if not getattr(self, name) >= 0:  # Written so that NaN fails it too.
                raise ConfigError(f"gc.{name}={getattr(self, name)} must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrubConfig:
    """The [scrub] section: the background consistency check of every stored entry
    (BookKeeper's localScrubPeriod / localScrubRateLimit; docs/operations.md)."""

    period_seconds: float = 0.0  # Between the starts of two scrubs; 0 turns the scrubber off.
    rate_entries_per_second: float = 60.0  # Entries read and verified per second, per shard.

    def __post_init__(self) -> None:
        if not self.period_seconds >= 0:
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
