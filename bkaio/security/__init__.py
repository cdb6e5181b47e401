"""Security pieces shared by the bookie, the client and the command line (docs/security.md).

    tls          SSL contexts for bookies (server, optional mutual TLS) and clients
    tokens       constant-time token comparison, the auth-failure throttle
    ledger_keys  the bookie's check of a ledger's first master key against its metadata
    local_ca     a throw-away CA and certificates for `bkaio standalone --tls`

Imports the standard library, `bkaio.errors`, `bkaio.protocol.digest` and (lazily) `cryptography`;
never the bookie server or the ledger client.
"""

from __future__ import annotations

from bkaio.security.ledger_keys import (
    LedgerKeyRefusedError,
    LedgerKeyVerifier,
    MetadataKeySource,
)
from bkaio.security.tls import (
    bookie_client_tls_context,
    client_tls_context,
    server_tls_context,
    server_tls_context_from_config,
)
from bkaio.security.tokens import AuthFailureThrottle, redact_uri, tokens_equal

__all__ = [
    "AuthFailureThrottle",
    "LedgerKeyRefusedError",
    "LedgerKeyVerifier",
    "MetadataKeySource",
    "bookie_client_tls_context",
    "client_tls_context",
    "redact_uri",
    "server_tls_context",
    "server_tls_context_from_config",
    "tokens_equal",
]
