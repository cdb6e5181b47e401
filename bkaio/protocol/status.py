"""The status codes of the wire protocol; defined below the protocol, in `bkaio.status`."""

from __future__ import annotations

from bkaio.status import Status

__all__ = ["Status"]
