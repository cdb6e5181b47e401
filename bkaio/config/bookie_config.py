"""`BookieConfig`, the resolved configuration a bookie runs with, and how it is built: sections
decoded from the TOML file and the environment (decoding.py), validated (sections.py), the
identity resolved (bookie id, advertised host, shard count) and one `StorageConfig` per shard.

Each component gets its own frozen branch: a shard worker gets `config.storage[shard_index]`, a
`StorageConfig` whose journal, ledger and index directories are that shard's own subdirectories
(`<dir>/shard-<i>`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bkaio.config.decoding import merge_sources, settable_fields
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
    admin_serves_https,
)
from bkaio.entrylog.config import StorageConfig
from bkaio.errors import ConfigError
from bkaio.journal import JournalConfig

_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


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
        if self.admin.enabled:
            admin_serves_https(self.admin, self.tls)  # Refuses admin.tls "on" without TLS.

    @property
    def admin_https(self) -> bool:
        """Whether the admin HTTP serves HTTPS (admin.tls; docs/security.md)."""
        return self.admin.enabled and admin_serves_https(self.admin, self.tls)

    def admin_url(self, port: int) -> str:
        """The admin API's base URL as others reach it on `port`: its scheme, and
        admin.host, or the advertised host when admin.host is a wildcard (0.0.0.0 reaches
        nothing from another machine, and a certificate names the advertised host)."""
        host = self.advertised_host if self.admin.host in _WILDCARD_HOSTS else self.admin.host
        if ":" in host:
            host = f"[{host}]"  # An IPv6 address.
        return f"{'https' if self.admin_https else 'http'}://{host}:{port}"

    def shard_port(self, shard_index: int) -> int:
        assert 0 <= shard_index < self.shard_count, (shard_index, self.shard_count)
        return self.port + shard_index

    def shard_of(self, ledger_id: int) -> int:
        """The shard that owns `ledger_id`."""
        return ledger_id % self.shard_count

    def directory_setting(self, directory: Path) -> str:
        """The key that places `directory`, one of the shards' directories, for an error about
        it to name what to change."""
        for storage in self.storage:
            if directory in storage.journal.directories:
                return "storage.journal_dirs"
            if directory in storage.ledger_dirs:
                return "storage.ledger_dirs"
            if directory in storage.index_dirs:
                ledger_dir = storage.ledger_dirs[storage.index_dirs.index(directory)]
                # Without index_dirs, each index directory sits beside its entry-log one
                # (<ledger dir>/shard-<i>/index and .../entrylog); with them, never.
                derived = ledger_dir.parent == directory.parent
                return "storage.ledger_dirs" if derived else "storage.index_dirs"
        raise ValueError(f"{directory} is none of the shards' directories")


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
    merged = merge_sources(data, env, origin)
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
        dir_keys = set(settable_fields(StorageDirs))
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
