"""Which gRPC failures the etcd driver may retry for a conditional write."""

from __future__ import annotations

import pytest
from aetcd import rpc

from bkaio.meta.etcd_connection import _never_sent, connection_lost


class FakeRpcError:
    def __init__(self, code: object, details: str) -> None:
        self._code = code
        self._details = details

    def code(self) -> object:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "lost", "never_sent"),
    [
        (
            rpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: Connection refused",
            True,
            True,
        ),
        (rpc.StatusCode.UNAVAILABLE, "etcdserver: no leader", True, True),
        (rpc.StatusCode.UNAVAILABLE, "Socket closed", True, False),
        (rpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", True, False),
        (rpc.StatusCode.INVALID_ARGUMENT, "etcdserver: key is not provided", False, False),
    ],
)
def test_only_requests_that_never_left_are_safe_to_resend(
    code: object, details: str, lost: bool, never_sent: bool
) -> None:
    error = FakeRpcError(code, details)
    assert connection_lost(error) is lost
    assert _never_sent(error) is never_sent
