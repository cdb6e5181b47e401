"""structlog set-up, once per process: JSON lines in services, readable lines in a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, json: bool = True, level: str = "info", cache: bool = False) -> None:
    """Configure structlog for this process. A filtered `debug` call costs one function call.

    `cache=True` (long-running services) binds each logger once, on first use; it also means a
    later reconfiguration, structlog.testing.capture_logs included, no longer reaches it.
    """
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One write per line: PrintLogger prints the line and its newline as two writes, so a
        # line longer than the stream's 8 KiB chunk (a traceback) left the process without its
        # newline, and the other process sharing the log file (a bookie's parent and shard
        # worker) could append its own line into the middle of it.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=cache,
    )


def configure_library_default() -> None:
    """Unless the application configured structlog, log warnings and worse to stderr only.

    structlog's own default prints every level to stdout, which would put a library's debug
    lines into an application's output. Services and the CLI call `configure_logging` instead.
    """
    if not structlog.is_configured():
        # Not cached: an application (or structlog.testing.capture_logs) may reconfigure later.
        configure_logging(json=False, level="warning")
