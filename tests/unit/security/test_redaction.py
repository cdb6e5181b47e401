"""`redact_uri` hides a URI's password and token however the URI spells them."""

from __future__ import annotations

import pytest

from bkaio.errors import ConfigError
from bkaio.meta.uri import parse_etcd_uri
from bkaio.security.tokens import redact_uri

SECRET = "hunter2"


@pytest.mark.parametrize(
    "uri",
    [
        # A percent-encoded option name is the same option to the URI parser.
        f"etcd://127.0.0.1:2379/bkaio?user=bk&pass%77ord={SECRET}",
        f"etcd://127.0.0.1:2379/bkaio?user=bk&%50ASSWORD={SECRET}",
        f"sqlite:///m.db?t%6Fken={SECRET}",
        # A '#' in a password not percent-encoded: all of it is the secret, not only what
        # precedes the '#' (which a URI parser takes for a fragment).
        f"etcd://127.0.0.1:2379/bkaio?user=bk&password=a#{SECRET}",
    ],
)
def test_oddly_spelled_secrets_are_hidden(uri: str) -> None:
    shown = redact_uri(uri)
    assert SECRET not in shown, shown
    assert "127.0.0.1:2379" in shown or "m.db" in shown


def test_other_options_are_still_shown() -> None:
    uri = f"etcd://h:2379/bkaio?ca=/x/ca.pem&user=bk&pass%77ord={SECRET}&timeout=3"
    assert redact_uri(uri) == "etcd://h:2379/bkaio?ca=/x/ca.pem&user=bk&pass%77ord=***&timeout=3"


def test_a_uri_error_does_not_show_an_encoded_password() -> None:
    with pytest.raises(ConfigError, match="timeout") as raised:
        parse_etcd_uri(f"etcd://127.0.0.1:2379/bkaio?user=bk&pass%77ord={SECRET}&timeout=-1")
    assert SECRET not in str(raised.value)
