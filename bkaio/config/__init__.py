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

    sections.py       one frozen dataclass per section, each validating its own values
    decoding.py       the file and the environment into typed values per section (msgspec)
    bookie_config.py  `BookieConfig`, the resolved per-shard tree; `load_bookie_config`

Typical use: `config = load_bookie_config(path)`; a shard worker gets `config.storage[i]`.
"""

from bkaio.config.bookie_config import BookieConfig, build_bookie_config, load_bookie_config
from bkaio.config.sections import (
    AdminConfig,
    AutorecoveryConfig,
    BookieSection,
    GcConfig,
    LogConfig,
    MetadataSection,
    ReadOnlyConfig,
    ScrubConfig,
    ServerConfig,
    StorageDirs,
    TlsConfig,
)

__all__ = [
    "AdminConfig",
    "AutorecoveryConfig",
    "BookieConfig",
    "BookieSection",
    "GcConfig",
    "LogConfig",
    "MetadataSection",
    "ReadOnlyConfig",
    "ScrubConfig",
    "ServerConfig",
    "StorageDirs",
    "TlsConfig",
    "build_bookie_config",
    "load_bookie_config",
]
