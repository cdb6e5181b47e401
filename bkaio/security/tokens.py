"""Auth tokens: compared in constant time, never logged; failures slowed down per host.

A refused HELLO is answered only after `AuthFailureThrottle.delay(host)`: the base delay, doubled
for each recent failure from the same host, up to a maximum. Failures are forgotten after a
quiet period, and the table of hosts is bounded so a flood of source addresses cannot grow it.
"""

from __future__ import annotations

import hmac
import re
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import unquote_plus


def tokens_equal(presented: str | bytes | None, expected: str | bytes) -> bool:
    """Whether `presented` is `expected`, in time that does not depend on where they differ."""
    if presented is None:
        presented = b""
    presented_bytes = presented.encode() if isinstance(presented, str) else bytes(presented)
    expected_bytes = expected.encode() if isinstance(expected, str) else bytes(expected)
    return hmac.compare_digest(presented_bytes, expected_bytes)


@dataclass(slots=True)
class _Failures:
    count: int
    last_at: float


class AuthFailureThrottle:
    """How long to hold back the answer to a failed authentication, per source host."""

    def __init__(
        self,
        base_delay_seconds: float,
        max_delay_seconds: float,
        *,
        forget_after_seconds: float = 60.0,
        max_hosts: int = 10_000,
    ) -> None:
        assert 0 <= base_delay_seconds <= max_delay_seconds, (base_delay_seconds, max_delay_seconds)
        assert max_hosts > 0, max_hosts
        self._base = base_delay_seconds
        self._max = max_delay_seconds
        self._forget_after = forget_after_seconds
        self._max_hosts = max_hosts
        self._hosts: OrderedDict[str, _Failures] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hosts)

    def failed(self, host: str, now: float) -> float:
        """Record a failure from `host`; the delay before answering it, in seconds."""
        failures = self._hosts.pop(host, None)
        if failures is None or now - failures.last_at > self._forget_after:
            failures = _Failures(0, now)
        failures.count += 1
        failures.last_at = now
        self._hosts[host] = failures  # Most recent last.
        while len(self._hosts) > self._max_hosts:
            self._hosts.popitem(last=False)
        if self._base == 0:
            return 0.0
        return min(self._base * 2.0 ** min(failures.count - 1, 30), self._max)


_QUERY_OPTION = re.compile(r"([?&][^=&#]*=)([^&]*)")
_SECRET_OPTIONS = frozenset({"password", "token"})


def _hide_secret(option: re.Match[str]) -> str:
    # The name as the URI parser reads it (pass%77ord is password); the value runs to the next
    # '&', a '#' included: a password with a '#' that is not percent-encoded is secret whole.
    name = unquote_plus(option.group(1)[1:-1]).lower()
    return option.group(1) + "***" if name in _SECRET_OPTIONS else option.group(0)


def redact_uri(uri: str) -> str:
    """`uri` with the values of its password/token query options replaced, for logs."""
    return _QUERY_OPTION.sub(_hide_secret, uri)
