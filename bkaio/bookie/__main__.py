"""`python -m bkaio.bookie --config bookie.toml`: run one bookie (parent plus shard workers)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bkaio.bookie.parent import run_bookie


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bkaio.bookie", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="bookie TOML file")
    args = parser.parse_args(argv)
    return run_bookie(args.config)


if __name__ == "__main__":
    sys.exit(main())
