"""Mistyped metadata URIs are ConfigErrors naming the URI (password hidden), never a ValueError
or a silently shortened password."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bkaio.cli.params import METADATA_URI
from bkaio.errors import ConfigError
from bkaio.meta.uri import parse_etcd_uri, parse_sqlite_uri


@pytest.mark.parametrize(
    "uri",
    [
        "etcd://[::1:2379/bkaio",
        "etcd://[::1:2379/bkaio?user=u&password=SECRET",
        "sqlite://[x/meta.db",
    ],
)
def test_an_unclosed_bracket_is_a_config_error(uri: str) -> None:
    parse = parse_etcd_uri if uri.startswith("etcd") else parse_sqlite_uri
    with pytest.raises(ConfigError, match=r"metadata URI .*\[") as caught:
        parse(uri)
    assert "SECRET" not in str(caught.value)


@pytest.mark.parametrize(
    "uri",
    [
        "etcd://h:2379/bkaio?user=u&password=ab#SECRET",  # An unencoded '#' in the password.
        "etcd://h:2379/bkaio#?user=u&password=SECRET",
        "sqlite:///var/lib/bkaio/meta#1.db",
    ],
)
def test_a_hash_is_a_config_error_not_a_cut(uri: str) -> None:
    parse = parse_etcd_uri if uri.startswith("etcd") else parse_sqlite_uri
    with pytest.raises(ConfigError, match="%23") as caught:
        parse(uri)
    assert "SECRET" not in str(caught.value)


def test_an_encoded_hash_in_a_password_is_kept() -> None:
    assert parse_etcd_uri("etcd://h:2379/bkaio?user=u&password=ab%23cd").password == "ab#cd"


def test_the_cli_reports_a_mistyped_uri_as_a_usage_error() -> None:
    @click.command()
    @click.option("--metadata", type=METADATA_URI)
    def command(metadata: str) -> None:
        del metadata

    result = CliRunner().invoke(command, ["--metadata", "etcd://[::1:2379/bkaio"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "metadata URI" in result.output


@pytest.mark.parametrize("option", ["passwd", "pwd", "pass", "pass%77d", "Pass+word"])
def test_a_mistyped_password_option_does_not_show_its_value(option: str) -> None:
    uri = f"etcd://h:2379/bkaio?user=u&{option}=SECRET&timeout=5"
    with pytest.raises(ConfigError, match="unknown option") as caught:
        parse_etcd_uri(uri)
    assert "SECRET" not in str(caught.value)
    assert "timeout=5" in str(caught.value)  # Known options are still shown as given.
    with pytest.raises(ConfigError, match="unknown option") as caught:
        parse_sqlite_uri(f"sqlite:///var/lib/bkaio/meta.db?{option}=SECRET")
    assert "SECRET" not in str(caught.value)
