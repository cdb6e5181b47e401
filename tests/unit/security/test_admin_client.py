"""admin_request_ssl: a client of a bookie's admin API follows the scheme the bookie registered,
and a mismatch with its own TLS settings is an error naming what to set, never plain HTTP by
default."""

from __future__ import annotations

import ssl

import pytest

from bkaio.errors import ConfigError
from bkaio.security.admin_client import AdminTlsMismatchError, admin_request_ssl

SETTING = "$BKAIO_TLS_CA"


@pytest.fixture
def context() -> ssl.SSLContext:
    return ssl.create_default_context()


def test_https_uses_the_context_and_plain_http_none(context: ssl.SSLContext) -> None:
    assert admin_request_ssl("https://b1:8180", context, tls_setting=SETTING) is context
    assert admin_request_ssl("http://10.0.0.7:8180", None, tls_setting=SETTING) is True


def test_https_without_tls_names_the_setting() -> None:
    with pytest.raises(AdminTlsMismatchError, match=r"serves HTTPS .* set \$BKAIO_TLS_CA"):
        admin_request_ssl("https://b1:8180", None, tls_setting=SETTING)


@pytest.mark.parametrize("host", ["10.0.0.7", "b1.example", "[2001:db8::1]"])
def test_a_tls_client_sends_no_token_in_clear_across_the_network(
    context: ssl.SSLContext, host: str
) -> None:
    with pytest.raises(AdminTlsMismatchError, match=r"plain HTTP .*admin\.tls = \"auto\""):
        admin_request_ssl(f"http://{host}:8180", context, tls_setting=SETTING)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_plain_http_on_loopback_is_allowed_to_a_tls_client(
    context: ssl.SSLContext, host: str
) -> None:
    assert admin_request_ssl(f"http://{host}:8180", context, tls_setting=SETTING) is True


def test_another_scheme_is_refused() -> None:
    with pytest.raises(ConfigError, match="neither http:// nor https://"):
        admin_request_ssl("ftp://b1:8180", None, tls_setting=SETTING)
