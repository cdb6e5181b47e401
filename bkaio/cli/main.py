"""The `bkaio` command: its root group and the one place that turns failures into exit codes.

Expected failures (a BKError, an unreachable address, bad arguments) print one line on stderr and
exit non-zero without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys

import click

from bkaio.cli.autorecovery_cmd import autorecovery
from bkaio.cli.bench_cmd import bench
from bkaio.cli.bookie_cmd import bookie
from bkaio.cli.shell import shell
from bkaio.cli.standalone import standalone
from bkaio.cli.stream_cmd import stream
from bkaio.errors import BKError
from bkaio.logs import configure_logging

EXIT_FAILURE = 1
EXIT_USAGE = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bkaio")
def cli() -> None:
    """bkaio: a replicated, durable, append-only log service (after Apache BookKeeper)."""


cli.add_command(standalone)
cli.add_command(bookie)
cli.add_command(shell)
cli.add_command(autorecovery)
cli.add_command(stream)
cli.add_command(bench)


def one_line(message: str) -> str:
    return " ".join(message.split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bkaio` console script; returns the exit code."""
    # Commands print their own results on stdout; library logs below error would only be
    # noise there (and break --json). Services (`bkaio bookie`) reconfigure for JSON logs.
    configure_logging(json=False, level=os.environ.get("BKAIO_LOG_LEVEL", "error"))
    try:
        result = cli.main(args=argv, prog_name="bkaio", standalone_mode=False)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.Abort:
        sys.stderr.write("bkaio: aborted\n")
        return EXIT_FAILURE
    except click.ClickException as error:
        sys.stderr.write(f"bkaio: error: {one_line(error.format_message())}\n")
        return EXIT_USAGE if isinstance(error, click.UsageError) else EXIT_FAILURE
    except BKError as error:
        sys.stderr.write(f"bkaio: {type(error).__name__}: {one_line(str(error))}\n")
        return EXIT_FAILURE
    except (OSError, TimeoutError) as error:
        sys.stderr.write(f"bkaio: {type(error).__name__}: {one_line(str(error))}\n")
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
