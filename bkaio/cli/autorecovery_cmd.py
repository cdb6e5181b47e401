"""`bkaio autorecovery`: an auditor candidate and replication worker outside any bookie."""

from __future__ import annotations

import asyncio
import signal

import click
import structlog

from bkaio.cli.common import client_options, metadata_option, run, start_metrics_server
from bkaio.cli.params import FiniteFloat, Int
from bkaio.fault_switches import fault_switch_refusal


@click.command("autorecovery")
@metadata_option
@click.option(
    "--admin-token",
    envvar="BKAIO_ADMIN_TOKEN",
    default="",
    help="The bookies' admin token (default: $BKAIO_ADMIN_TOKEN).",
)
@click.option(
    "--lost-bookie-delay",
    default=30.0,
    show_default=True,
    type=FiniteFloat(min=0),
    help="Seconds a bookie must stay gone before its ledgers are re-replicated.",
)
@click.option("--no-auditor", is_flag=True, help="Only replicate; never run for auditor.")
@click.option(
    "--metrics-port",
    default=0,
    type=Int(0, 65535),
    help="Serve Prometheus metrics (autorecovery and process_*) on this port (0: off).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
def autorecovery(
    metadata_uri: str,
    admin_token: str,
    lost_bookie_delay: float,
    no_auditor: bool,
    metrics_port: int,
    metrics_host: str,
) -> None:
    """Run autorecovery (auditor election + replication worker) until Ctrl-C or SIGTERM."""
    refusal = fault_switch_refusal()
    if refusal is not None:
        raise click.UsageError(refusal)  # Exit 2: its recoveries must fence as in production.
    from prometheus_client import CollectorRegistry, ProcessCollector

    from bkaio.autorecovery import run_autorecovery
    from bkaio.autorecovery.metrics import metrics_page
    from bkaio.config import AutorecoveryConfig
    from bkaio.logs import configure_logging

    configure_logging(json=True, level="info")
    if not admin_token:  # As a bookie without admin.token warns: it audits, but copies nothing.
        structlog.get_logger(__name__).warning(
            "autorecovery_without_admin_token",
            hint="pass --admin-token or set BKAIO_ADMIN_TOKEN (the bookies' admin.token): "
            "replication needs it to learn ledgers' master keys from the bookies",
        )
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    if metrics_port:
        # With the default registry's bkaio_* families (lease late refreshes, library jobs).
        start_metrics_server(metrics_port, metrics_host, metrics_page(registry))
    config = AutorecoveryConfig(
        lost_bookie_delay_seconds=lost_bookie_delay, auditor_enabled=not no_auditor
    )

    options = client_options()  # $BKAIO_TLS_CA (also for HTTPS admin APIs), the HELLO token.

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        return await run_autorecovery(
            metadata_uri,
            config=config,
            admin_token=admin_token,
            stop=stop,
            metrics_registry=registry,
            **options,
        )

    code = run(go())
    if code:
        raise SystemExit(code)  # A task failed for good: the service manager restarts us.
