"""The bookie server: shard-per-core worker processes, connection handling, request dispatch,
registration, read-only mode, admin HTTP and metrics. See docs/bookie.md.

`run_bookie(config_path)` runs one bookie (what `bkaio bookie --config` calls). Imports
protocol, journal, entrylog and meta; never the ledger client.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["run_bookie"]


def run_bookie(config_path: Path) -> int:
    """Run a bookie until SIGTERM/SIGINT and return the process exit code."""
    from bkaio.bookie.parent import run_bookie as run

    return run(config_path)
