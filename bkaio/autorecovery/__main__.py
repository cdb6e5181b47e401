"""`python -m bkaio.autorecovery --metadata URI [--admin-token T]`: a standalone auditor
candidate and replication worker (what `bkaio autorecovery` runs), until SIGTERM/SIGINT.
TLS and the HELLO token come from $BKAIO_TLS_CA/CERT/KEY and $BKAIO_AUTH_TOKEN."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import uvloop

from bkaio.cli.common import client_options
from bkaio.config import AutorecoveryConfig
from bkaio.logs import configure_logging

from .service import run_autorecovery


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bkaio.autorecovery")
    parser.add_argument("--metadata", default=os.environ.get("BKAIO_METADATA", ""))
    parser.add_argument("--admin-token", default=os.environ.get("BKAIO_ADMIN_TOKEN", ""))
    parser.add_argument("--lost-bookie-delay", type=float, default=30.0)
    parser.add_argument("--no-auditor", action="store_true")
    args = parser.parse_args(argv)
    if not args.metadata:
        parser.error("--metadata URI (or BKAIO_METADATA) is required")
    configure_logging()
    config = AutorecoveryConfig(
        lost_bookie_delay_seconds=args.lost_bookie_delay, auditor_enabled=not args.no_auditor
    )
    # As `bkaio autorecovery`: $BKAIO_TLS_CA (+ CERT/KEY; also for HTTPS admin APIs) and
    # $BKAIO_AUTH_TOKEN, what the bookies require of clients.
    options = client_options()

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await run_autorecovery(
            args.metadata, config=config, admin_token=args.admin_token, stop=stop, **options
        )

    return uvloop.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
