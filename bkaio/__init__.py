"""bkaio: a replicated, durable, append-only log service in asyncio Python (after Apache BookKeeper)."""

from __future__ import annotations

__version__ = "0.1.0"
