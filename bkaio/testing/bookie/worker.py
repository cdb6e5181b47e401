"""`python -m bkaio.testing.bookie.worker [--disk ...] [--crash-point ...] [--mutation ...]
--config F --shard N [--instance-id ID]`: the production shard worker (bkaio.bookie.worker) with
the storage parts built from the injection options. Started by `python -m bkaio.testing.bookie`.
"""

from __future__ import annotations

import argparse
import sys

from bkaio.bookie import worker
from bkaio.errors import ConfigError
from bkaio.testing.bookie import add_injection_options, injected_parts

PROG = "python -m bkaio.testing.bookie.worker"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    add_injection_options(parser)
    args, rest = parser.parse_known_args(argv)
    try:
        seams = injected_parts(args).seams()
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return worker.EXIT_START_FAILED
    return worker.main(rest, seams=seams, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
