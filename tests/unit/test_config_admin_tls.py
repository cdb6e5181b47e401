"""admin.tls: the admin HTTP serves HTTPS with the bookie's certificate ("auto" when the bookie
has TLS, "on" required, "off" plain). Bad values and "on" without the bookie's TLS are refused
at load, naming the settings; the admin URL a bookie registers carries the scheme."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bkaio.config import build_bookie_config, load_bookie_config
from bkaio.errors import ConfigError

TLS = {"enabled": True, "cert_file": "/etc/bkaio/bookie.pem", "key_file": "/etc/bkaio/bookie.key"}


def _config(
    admin: dict[str, Any], tls: dict[str, Any] | None = None, host: str = "10.0.0.7"
) -> Any:
    data: dict[str, Any] = {
        "bookie": {"host": host, "port": 4000, "shards": 1, "advertised_host": "b1.example"},
        "admin": {"port": 8180, **admin},
    }
    if tls is not None:
        data["tls"] = tls
    return build_bookie_config(data, env={})


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[admin]\ntls = "yes"\n', "admin.tls='yes' must be auto|on|off"),
        ("[admin]\ntls = true\n", "admin.tls=True must be a string"),
        (
            '[admin]\ntls = "on"\n',
            'admin.tls = "on" needs tls.enabled = true with tls.cert_file and tls.key_file',
        ),
        (
            '[admin]\ntls = "on"\n[tls]\nenabled = false\ncert_file = "/c.pem"\nkey_file = "/k"\n',
            'admin.tls = "on" needs tls.enabled = true',
        ),
    ],
)
def test_bad_admin_tls_is_refused_naming_the_settings(
    tmp_path: Path, toml: str, message: str
) -> None:
    path = tmp_path / "bookie.toml"
    path.write_text('[bookie]\nhost = "127.0.0.1"\nport = 4000\nshards = 1\n' + toml)
    with pytest.raises(ConfigError) as error:
        load_bookie_config(path, env={})
    assert str(path) in str(error.value) and message in str(error.value)


def test_the_environment_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"admin\.tls='maybe' must be auto\|on\|off"):
        build_bookie_config(
            {"bookie": {"port": 4000, "shards": 1}}, env={"BKAIO_ADMIN_TLS": "maybe"}
        )
    with pytest.raises(ConfigError, match=r'admin\.tls = "on" needs tls\.enabled'):
        build_bookie_config({"bookie": {"port": 4000, "shards": 1}}, env={"BKAIO_ADMIN_TLS": "on"})


def test_a_disabled_admin_api_needs_no_certificate() -> None:
    config = _config({"enabled": False, "tls": "on"})
    assert not config.admin_https


@pytest.mark.parametrize(
    ("admin_tls", "tls", "https"),
    [
        ("auto", None, False),  # A cluster without TLS works as before.
        ("auto", TLS, True),
        ("on", TLS, True),
        ("off", TLS, False),
        ("off", None, False),
    ],
)
def test_the_scheme_follows_admin_tls_and_the_bookies_tls(
    admin_tls: str, tls: dict[str, Any] | None, https: bool
) -> None:
    config = _config({"tls": admin_tls, "host": "10.0.0.7"}, tls)
    assert config.admin_https is https
    scheme = "https" if https else "http"
    assert config.admin_url(8181) == f"{scheme}://10.0.0.7:8181"


def test_a_wildcard_admin_host_registers_the_advertised_host() -> None:
    # 0.0.0.0 reaches nothing from another machine, and a certificate names the host.
    assert _config({"host": "0.0.0.0"}, TLS).admin_url(8180) == "https://b1.example:8180"
    assert _config({"host": "::1"}).admin_url(8180) == "http://[::1]:8180"
