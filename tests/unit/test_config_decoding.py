"""bkaio.config decodes with msgspec: every bad value is a ConfigError naming the file (or the
environment variable), the key and the value; the environment's spellings still work."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.config import build_bookie_config, load_bookie_config
from bkaio.errors import ConfigError

MINIMAL = {"bookie": {"host": "127.0.0.1", "port": 4000, "shards": 1}}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[server]\nmax_frame_bytes = 'big'\n", "server.max_frame_bytes='big' must be an integer"),
        ("[admin]\nenabled = 1\n", "admin.enabled=1 must be a boolean"),
        ("[gc]\ngrace_seconds = 'soon'\n", "gc.grace_seconds='soon' must be a number"),
        ("[storage]\nledger_dirs = ['/a', '']\n", "storage.ledger_dirs[1]='' must be a non-empty"),
        ("[storage]\nledger_dirs = 3\n", "storage.ledger_dirs=3 must be a list"),
        ("[bookie]\nrack = 5\n", "bookie.rack=5 must be a string"),
        ("bookie = 3\n", "bookie must be a table ([bookie])"),
        (
            "[bookie]\nprot = 1\n",
            "unknown key bookie.prot; known keys of [bookie]: advertised_host",
        ),
        ("[bokie]\n", "unknown section [bokie]; known: admin, autorecovery"),
        ("[bookie]\nport = 70000\n", "bookie.port=70000 must be in [1, 65535]"),
    ],
)
def test_a_bad_file_names_the_file_and_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as error:
        load_bookie_config(path, env={})
    assert str(path) in str(error.value) and message in str(error.value)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("BKAIO_BOOKIE_PORT", "x", "environment BKAIO_BOOKIE_PORT='x' must be an integer"),
        ("BKAIO_ADMIN_ENABLED", "maybe", "BKAIO_ADMIN_ENABLED='maybe' must be a boolean"),
        ("BKAIO_GC_GRACE_SECONDS", "soon", "BKAIO_GC_GRACE_SECONDS='soon' must be a number"),
    ],
)
def test_a_bad_environment_value_names_the_variable(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        build_bookie_config(MINIMAL, env={variable: value})


def test_the_environments_spellings() -> None:
    config = build_bookie_config(
        MINIMAL,
        env={
            "BKAIO_ADMIN_ENABLED": "off",
            "BKAIO_TLS_REQUIRE_CLIENT_CERT": "no",
            "BKAIO_SERVER_MAX_CONNECTIONS": "1_000",
            "BKAIO_STORAGE_LEDGER_DIRS": " /x , /y ,",
            "BKAIO_JOURNAL_SYNC": "YES",
            "BKAIO_GC_GRACE_SECONDS": "2",
        },
    )
    assert config.admin.enabled is False and config.tls.require_client_cert is False
    assert config.server.max_connections == 1000 and config.gc.grace_seconds == 2.0
    assert [d.parent.parent for d in config.storage[0].ledger_dirs] == [Path("/x"), Path("/y")]
    assert config.storage[0].journal.sync is True


def test_file_values_keep_their_types() -> None:
    config = build_bookie_config(
        {
            **MINIMAL,
            "gc": {"interval_seconds": 5},  # An integer where a number is wanted is fine.
            "storage": {"journal_dirs": "/j", "ledger_dirs": ["~/data"]},  # One string: a list.
        },
        env={},
    )
    assert config.gc.interval_seconds == 5.0 and isinstance(config.gc.interval_seconds, float)
    assert config.storage[0].journal.directories == (Path("/j/shard-0"),)
    assert config.storage[0].ledger_dirs[0].is_relative_to(Path.home())
