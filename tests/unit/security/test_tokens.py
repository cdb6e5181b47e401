"""Token comparison, the auth-failure throttle and URI redaction."""

from __future__ import annotations

import pytest

from bkaio.security.tokens import AuthFailureThrottle, redact_uri, tokens_equal


@pytest.mark.parametrize(
    ("presented", "expected", "equal"),
    [
        ("secret", "secret", True),
        (b"secret", "secret", True),
        ("secret", "secreT", False),
        ("secre", "secret", False),
        ("", "secret", False),
        (None, "secret", False),
        ("sécret", "sécret", True),
    ],
)
def test_tokens_equal(presented: str | bytes | None, expected: str, equal: bool) -> None:
    assert tokens_equal(presented, expected) is equal


def test_throttle_doubles_per_failure_up_to_the_max() -> None:
    throttle = AuthFailureThrottle(0.25, 2.0)
    delays = [throttle.failed("10.0.0.1", now=float(i)) for i in range(6)]
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert throttle.failed("10.0.0.2", now=6.0) == 0.25  # Another host starts afresh.


def test_throttle_forgets_a_quiet_host() -> None:
    throttle = AuthFailureThrottle(0.25, 2.0, forget_after_seconds=10.0)
    throttle.failed("h", now=0.0)
    throttle.failed("h", now=1.0)
    assert throttle.failed("h", now=100.0) == 0.25


def test_throttle_table_is_bounded() -> None:
    throttle = AuthFailureThrottle(0.1, 1.0, max_hosts=100)
    for i in range(10_000):
        throttle.failed(f"host-{i}", now=0.0)
    assert len(throttle) == 100


def test_zero_delay_turns_the_throttle_off() -> None:
    assert AuthFailureThrottle(0.0, 0.0).failed("h", now=0.0) == 0.0


def test_redact_uri_hides_passwords_and_tokens() -> None:
    uri = "etcd://127.0.0.1:2379/bkaio?ca=/x/ca.pem&user=bk&password=hunter2&timeout=3"
    redacted = redact_uri(uri)
    assert "hunter2" not in redacted
    assert redacted == "etcd://127.0.0.1:2379/bkaio?ca=/x/ca.pem&user=bk&password=***&timeout=3"
    assert redact_uri("etcd://h:1/p?token=abc") == "etcd://h:1/p?token=***"
    assert redact_uri("sqlite:///var/meta.db") == "sqlite:///var/meta.db"
