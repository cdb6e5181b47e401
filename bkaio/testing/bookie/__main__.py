"""`python -m bkaio.testing.bookie --config bookie.toml [--disk ...] [--crash-point ...]
[--mutation ...]`: the production bookie with injected parts (see bkaio.testing.bookie)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bkaio.bookie.parent import EXIT_START_FAILED, run_bookie
from bkaio.errors import ConfigError
from bkaio.testing.bookie import add_injection_options, injected_parts, worker_command

PROG = "python -m bkaio.testing.bookie"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="bookie TOML file")
    add_injection_options(parser)
    args = parser.parse_args(argv)
    parts = injected_parts(args)
    try:
        parts.seams()  # A bad spec fails here, once, rather than in every worker.
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_START_FAILED
    return run_bookie(args.config, worker_command=worker_command(parts))


if __name__ == "__main__":
    sys.exit(main())
