"""The test entry point of a bookie: the production bookie, parent and shard workers, with the
parts a fault test injects.

    python -m bkaio.testing.bookie --config bookie.toml [--disk SPEC]
        [--crash-point NAME[:N]] [--mutation ack_before_fsync]

`--disk` is a `bkaio.testing.disk` spec (lazy, tear, eio_after_syncs=N, usage_file=PATH, ...),
`--crash-point` one of bkaio.journal.crash_points (the n-th pass exits 137), `--mutation` a
deliberately broken journal (bkaio.testing.mutations). The parent is `bkaio.bookie.parent`
unchanged; it starts each shard worker as `python -m bkaio.testing.bookie.worker` with the same
options, and the worker runs `bkaio.bookie.worker` with the `StorageSeams` built from them (one
disk per worker process, shared by its journal, entry logs and disk checks). Without options it
is the production bookie. The options are the only way in: nothing reads them from the
environment, and the retired variables make this entry point refuse to start as well.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from bkaio.bookie.seams import PRODUCTION_SEAMS, StorageSeams
from bkaio.testing.crash_points import CrashAt
from bkaio.testing.disk import disk_from_spec
from bkaio.testing.mutations import journal_mutation

WORKER_MODULE = "bkaio.testing.bookie.worker"


@dataclass(frozen=True, slots=True)
class InjectedParts:
    """What a test injects into one bookie run, as the entry points' options say it."""

    disk: str = ""  # A bkaio.testing.disk spec; empty: the real disk.
    crash_point: str = ""  # NAME or NAME:N; empty: none.
    mutation: str = ""  # A journal mutation's name; empty: none.

    def argv(self) -> list[str]:
        """The options of `python -m bkaio.testing.bookie` (and of its workers) for these."""
        options: list[str] = []
        for flag, value in (
            ("--disk", self.disk),
            ("--crash-point", self.crash_point),
            ("--mutation", self.mutation),
        ):
            if value:
                options += [flag, value]
        return options

    def seams(self) -> StorageSeams:
        """The parts themselves (ConfigError for a bad spec). Call once per process: a disk
        holds the unsynced writes of that process."""
        if not (self.disk or self.crash_point or self.mutation):
            return PRODUCTION_SEAMS
        return StorageSeams(
            disk=disk_from_spec(self.disk) if self.disk else PRODUCTION_SEAMS.disk,
            crash_points=(
                CrashAt.from_spec(self.crash_point)
                if self.crash_point
                else PRODUCTION_SEAMS.crash_points
            ),
            journal_ack=(
                journal_mutation(self.mutation) if self.mutation else PRODUCTION_SEAMS.journal_ack
            ),
        )


def add_injection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--disk", default="", metavar="SPEC", help="a bkaio.testing.disk spec")
    parser.add_argument(
        "--crash-point", default="", metavar="NAME[:N]", help="exit 137 at the n-th pass"
    )
    parser.add_argument("--mutation", default="", metavar="NAME", help="e.g. ack_before_fsync")


def injected_parts(args: argparse.Namespace) -> InjectedParts:
    return InjectedParts(disk=args.disk, crash_point=args.crash_point, mutation=args.mutation)


def worker_command(parts: InjectedParts) -> tuple[str, ...]:
    """How the parent starts its shard workers so that they get the same parts."""
    return (sys.executable, "-m", WORKER_MODULE, *parts.argv())
