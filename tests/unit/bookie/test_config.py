"""bkaio.config: TOML plus BKAIO_<SECTION>_<KEY> overrides into one frozen, validated tree."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

import pytest

from bkaio.config import (
    AutorecoveryConfig,
    GcConfig,
    MetadataSection,
    ReadOnlyConfig,
    ScrubConfig,
    ServerConfig,
    build_bookie_config,
    load_bookie_config,
)
from bkaio.entrylog.config import StorageConfig
from bkaio.errors import ConfigError
from bkaio.journal import JournalConfig

MINIMAL = {
    "bookie": {"host": "127.0.0.1", "port": 4000, "shards": 2},
    "storage": {"journal_dirs": ["/j"], "ledger_dirs": ["/d1", "/d2"]},
}


def test_each_shard_gets_its_own_directories() -> None:
    config = build_bookie_config(MINIMAL, env={})
    assert config.bookie_id == "127.0.0.1:4000" and config.shard_count == 2
    assert [config.shard_port(i) for i in range(2)] == [4000, 4001]
    assert config.shard_of(7) == 1
    second = config.storage[1]
    assert second.journal.directories == (Path("/j/shard-1"),)
    assert second.ledger_dirs == (Path("/d1/shard-1/entrylog"), Path("/d2/shard-1/entrylog"))
    assert second.index_dirs == (Path("/d1/shard-1/index"), Path("/d2/shard-1/index"))


def test_environment_overrides_the_file() -> None:
    env = {
        "BKAIO_BOOKIE_PORT": "5000",
        "BKAIO_READ_ONLY_DISK_READ_ONLY_FRACTION": "0.8",
        "BKAIO_READ_ONLY_DISK_WRITABLE_FRACTION": "0.7",
        "BKAIO_READ_ONLY_DISK_WARN_FRACTION": "0.7",
        "BKAIO_STORAGE_LEDGER_DIRS": "/x,/y",
        "BKAIO_JOURNAL_SYNC": "false",
        "BKAIO_ADMIN_ENABLED": "no",
        "BKAIO_METADATA": "etcd://elsewhere",  # Not a section key: another tool's variable.
        "BKAIO_SEED": "7",
        # The command line's TLS files (docs/security.md), often exported where bookies start.
        "BKAIO_TLS_CA": "/etc/bkaio/ca.pem",
        "BKAIO_TLS_CERT": "/etc/bkaio/client.pem",
        "BKAIO_TLS_KEY": "/etc/bkaio/client.key",
    }
    config = build_bookie_config(MINIMAL, env=env)
    assert config.port == 5000 and config.bookie_id == "127.0.0.1:5000"
    assert config.read_only.disk_read_only_fraction == 0.8
    assert config.storage[0].disk_read_only_fraction == 0.8
    assert config.storage[0].ledger_dirs[0] == Path("/x/shard-0/entrylog")
    assert config.storage[0].journal.sync is False
    assert config.admin.enabled is False


@pytest.mark.parametrize(
    ("data", "env", "message"),
    [
        ({"bookie": {"prot": 1}}, {}, "unknown key bookie.prot"),
        ({"bokie": {}}, {}, "unknown section [bokie]"),
        (
            {"server": {"max_frame_bytes": "big"}},
            {},
            "server.max_frame_bytes='big' must be an integer",
        ),
        ({"admin": {"enabled": 1}}, {}, "must be a boolean"),
        ({"admin": {"host": ""}}, {}, "admin.host is empty"),
        (
            {},
            {"BKAIO_SERVER_MAX_FRAMES": "3"},
            "BKAIO_SERVER_MAX_FRAMES names unknown key server.max_frames",
        ),
        ({}, {"BKAIO_BOOKIE_PORT": "x"}, "environment BKAIO_BOOKIE_PORT='x' must be an integer"),
        ({"bookie": {"port": 70000}}, {}, "bookie.port=70000"),
        ({"journal": {"max_group_bytes": 0}}, {}, "journal.max_group_bytes=0"),
        ({"storage": {"ledger_dirs": ["relative"]}}, {}, "must be absolute"),
        ({"read_only": {"disk_writable_fraction": 0.99}}, {}, "disk_writable_fraction"),
        ({"journal": {"directories": ["/x"]}}, {}, "unknown key journal.directories"),
        # Gone from the production config: tests fake disk usage through the Disk seam.
        (
            {"read_only": {"debug_disk_usage_file": "/tmp/u"}},
            {},
            "unknown key read_only.debug_disk_usage_file",
        ),
        # No float key takes nan or inf, from the file (TOML spells them) or the environment.
        (
            {"server": {"hello_timeout_seconds": math.nan}},
            {},
            "server.hello_timeout_seconds=nan must be a finite number",
        ),
        ({"gc": {"grace_seconds": math.inf}}, {}, "gc.grace_seconds=inf must be a finite number"),
        (
            {"scrub": {"period_seconds": math.inf}},
            {},
            "scrub.period_seconds=inf must be a finite number",
        ),
        (
            {
                "storage": {
                    "journal_dirs": ["/j"],
                    "ledger_dirs": ["/d"],
                    "flush_interval_seconds": math.nan,
                }
            },
            {},
            "storage.flush_interval_seconds=nan must be a finite number",
        ),
        (
            {},
            {"BKAIO_READ_ONLY_DISK_CHECK_INTERVAL_SECONDS": "nan"},
            "environment BKAIO_READ_ONLY_DISK_CHECK_INTERVAL_SECONDS='nan' must be a finite",
        ),
        (
            {},
            {"BKAIO_AUTORECOVERY_LOST_BOOKIE_DELAY_SECONDS": "inf"},
            "BKAIO_AUTORECOVERY_LOST_BOOKIE_DELAY_SECONDS='inf' must be a finite number",
        ),
        (
            {},
            {"BKAIO_SERVER_MAX_LONG_POLL_SECONDS": "NaN"},
            "BKAIO_SERVER_MAX_LONG_POLL_SECONDS='NaN' must be a finite number",
        ),
        # The bookie id is a metadata key: the registration refuses a '/' in it.
        ({"bookie": {"bookie_id": "x/y"}}, {}, "bookie.bookie_id='x/y' must not contain '/'"),
        (
            {"bookie": {"host": "127.0.0.1", "advertised_host": "a/b"}},
            {},
            "bookie.advertised_host='a/b' must not contain '/'",
        ),
        ({"bookie": {"host": ""}}, {}, "bookie.host is empty"),
        # A lease's keep-alive runs every third of its TTL: not hundreds of times a second.
        (
            {"autorecovery": {"auditor_lease_ttl_seconds": 0.01}},
            {},
            "autorecovery.auditor_lease_ttl_seconds=0.01 must be in [1, 3600]",
        ),
        (
            {},
            {"BKAIO_AUTORECOVERY_WORKER_LEASE_TTL_SECONDS": "86400"},
            "autorecovery.worker_lease_ttl_seconds=86400.0 must be in [1, 3600]",
        ),
        ({"metadata": {"registration_ttl_seconds": 0.5}}, {}, "must be in [1, 3600]"),
        ({"bookie": {"host": " "}}, {}, "bookie.host is empty"),
        # An entry and its envelope (4 KiB) must fit one frame.
        (
            {"server": {"max_entry_bytes": 20_000_000}},
            {},
            "server.max_entry_bytes=20000000 must be <= server.max_frame_bytes=8388608 - 4096",
        ),
        (
            {"server": {"max_frame_bytes": 64 * 1024, "max_entry_bytes": 64 * 1024 - 4095}},
            {},
            "server.max_entry_bytes=61441 must be <= server.max_frame_bytes=65536 - 4096",
        ),
    ],
)
def test_bad_input_is_a_config_error_naming_the_key(
    data: dict[str, dict[str, object]], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        build_bookie_config({**MINIMAL, **data} if "storage" not in data else data, env=env)


def test_load_reports_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_bookie_config(tmp_path / "nope.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("[bookie\nport = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_bookie_config(broken, env={})
    good = tmp_path / "good.toml"
    good.write_text('[bookie]\nport = 3999\nhost = "127.0.0.1"\nshards = 1\n')
    config = load_bookie_config(good, env={})
    assert config.source == good and config.bookie_id == "127.0.0.1:3999"


def test_an_entry_that_fits_a_frame_with_its_envelope_is_accepted() -> None:
    server = {"max_frame_bytes": 64 * 1024, "max_entry_bytes": 64 * 1024 - 4096}
    config = build_bookie_config({**MINIMAL, "server": server}, env={})
    assert config.server.max_entry_bytes == 60 * 1024


def _storage(**options: Any) -> StorageConfig:
    journal = JournalConfig(directories=(Path("/j"),))
    return StorageConfig(
        journal=journal, ledger_dirs=(Path("/d"),), index_dirs=(Path("/i"),), **options
    )


def _float_fields(cls: type[Any]) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if f.init and hints[f.name] is float]


_SECTIONS_WITH_FLOATS = (
    MetadataSection,
    ServerConfig,
    ReadOnlyConfig,
    AutorecoveryConfig,
    GcConfig,
    ScrubConfig,
    StorageConfig,
)


@pytest.mark.parametrize(
    ("cls", "name"),
    [(cls, name) for cls in _SECTIONS_WITH_FLOATS for name in _float_fields(cls)],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_a_section_built_directly_refuses_nan_in_every_float(cls: type[Any], name: str) -> None:
    """The decoding refuses nan for the file and the environment; a section built in code is
    checked by its own rules, each written so that NaN (false in every comparison) fails it."""
    build = _storage if cls is StorageConfig else cls
    with pytest.raises(ConfigError, match=f"{name}"):
        build(**{name: math.nan})


def test_every_directory_names_the_key_that_places_it() -> None:
    derived = build_bookie_config(MINIMAL, env={})
    shard = derived.storage[1]
    assert derived.directory_setting(shard.journal.directories[0]) == "storage.journal_dirs"
    assert derived.directory_setting(shard.ledger_dirs[1]) == "storage.ledger_dirs"
    assert derived.directory_setting(shard.index_dirs[1]) == "storage.ledger_dirs"
    storage = {"journal_dirs": ["/j"], "ledger_dirs": ["/d1", "/d2"], "index_dirs": ["/i1", "/i2"]}
    explicit = build_bookie_config({**MINIMAL, "storage": storage}, env={})
    shard = explicit.storage[0]
    assert explicit.directory_setting(shard.ledger_dirs[0]) == "storage.ledger_dirs"
    assert explicit.directory_setting(shard.index_dirs[1]) == "storage.index_dirs"
