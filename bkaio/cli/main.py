"""The `bkaio` command: its root group and the one place that turns failures into exit codes.

Expected failures (a BKError, an unreachable address, bad arguments) print one line on stderr and
exit non-zero without a traceback: exit 2 for a bad command line (a usage error), 1 otherwise.
With `--json` that line is a JSON object `{"error": ..., "kind": ...}` (still on stderr, still
the same exit code; stdout carries only results). Anything else is a bug and keeps its
traceback. A command whose stdout is closed under it (`... | head`) stops quietly with 141, the
status a shell shows for a command SIGPIPE killed (`seq 1 100000 | head -1`).
"""

from __future__ import annotations

import os
import signal
import sys

import click

from bkaio.cli.autorecovery_cmd import autorecovery
from bkaio.cli.bench_cmd import bench
from bkaio.cli.bookie_cmd import bookie
from bkaio.cli.output import StdoutClosed, emit_error
from bkaio.cli.shell import shell
from bkaio.cli.standalone import standalone
from bkaio.cli.stream_cmd import stream
from bkaio.cli.stream_info import info as stream_info
from bkaio.cli.stream_orphans import orphans
from bkaio.errors import BKError
from bkaio.logs import configure_logging

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bkaio")
def cli() -> None:
    """bkaio: a replicated, durable, append-only log service (after Apache BookKeeper)."""


cli.add_command(standalone)
cli.add_command(bookie)
cli.add_command(shell)
cli.add_command(autorecovery)
stream.add_command(stream_info)
stream.add_command(orphans)
cli.add_command(stream)
cli.add_command(bench)


def _wants_json(argv: list[str]) -> bool:
    """Whether the command line asked for --json: known before click parses it, so that even
    a usage error comes out as JSON."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bkaio` console script; returns the exit code."""
    # Commands print their own results on stdout; library logs below error would only be
    # noise there (and break --json). Services (`bkaio bookie`) reconfigure for JSON logs.
    configure_logging(json=False, level=os.environ.get("BKAIO_LOG_LEVEL", "error"))
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = _wants_json(args)
    try:
        result = cli.main(args=args, prog_name="bkaio", standalone_mode=False)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.Abort:
        emit_error("aborted", "Aborted", as_json=as_json)
        return EXIT_FAILURE
    except click.ClickException as error:
        usage = isinstance(error, click.UsageError)
        emit_error(error.format_message(), "UsageError" if usage else "error", as_json=as_json)
        return EXIT_USAGE if usage else EXIT_FAILURE
    except (BKError, OSError, TimeoutError) as error:
        emit_error(str(error) or repr(error), type(error).__name__, as_json=as_json)
        return EXIT_FAILURE
    except StdoutClosed:
        _drop_stdout()
        return EXIT_STDOUT_CLOSED
    except KeyboardInterrupt:
        return 130
    return int(result) if isinstance(result, int) else 0


def _drop_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for the closed pipe would fail again
    when Python flushes it at exit, printing "Exception ignored ... BrokenPipeError"."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # No file behind it (a test's capture): nothing to flush.
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
