"""Environment variables of the command line that a bookie must not read as its own settings.

A leaf module (no imports), so the command line names them without loading the bookie's config
code, and the bookie's config decoding (bkaio.config.decoding) skips them by the same names.
"""

from __future__ import annotations

from typing import Final

# The command line's client TLS files (bkaio.cli.common.client_tls_from_env). They look like
# [tls] keys of a bookie's BKAIO_<SECTION>_<KEY> overrides, but the bookie's own are
# BKAIO_TLS_CA_FILE, BKAIO_TLS_CERT_FILE and so on; an operator exports these in the shell
# where they also start bookies, which read as overrides stopped with "unknown key tls.ca".
CLIENT_TLS_ENV_CA: Final = "BKAIO_TLS_CA"
CLIENT_TLS_ENV_CERT: Final = "BKAIO_TLS_CERT"
CLIENT_TLS_ENV_KEY: Final = "BKAIO_TLS_KEY"
COMMAND_LINE_ONLY: Final = frozenset({CLIENT_TLS_ENV_CA, CLIENT_TLS_ENV_CERT, CLIENT_TLS_ENV_KEY})
