"""Faults on files and processes that BookieCluster and LinkProxy do not already offer.

- journal damage on a stopped bookie: `truncate_journal_tail`, `tear_journal_tail`,
  `flip_journal_bits` (a bit flip *before* the tail: mid-file corruption);
- `seed_from_env`: the scenario seed (BKAIO_SEED, else random), printed by every test;
- `tmpfs`: a size-limited tmpfs for disk-full tests (root only; skips otherwise).
Processes and mounts made here are undone in `finally` blocks by their callers.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.journal.files import HEADER_BYTES, list_file_ids


def seed_from_env() -> int:
    raw = os.environ.get("BKAIO_SEED")
    return int(raw) if raw else random.randrange(1 << 31)


def journal_files(bookie_dir: Path) -> list[Path]:
    directory = bookie_dir / "journal"
    found: list[Path] = []
    for root, _dirs, _files in os.walk(directory):
        ids = list_file_ids(Path(root))
        found += [Path(root) / f"{i:016x}.jnl" for i in ids]
    return sorted(found, key=lambda p: (p.parent, p.name))


def _used_bytes(path: Path) -> int:
    """Bytes up to the last non-zero byte (journal files are preallocated with zeros)."""
    data = path.read_bytes()
    return len(data.rstrip(b"\0"))


def truncate_journal_tail(bookie_dir: Path, rng: random.Random) -> str:
    """Cut the newest non-empty journal file at a random offset within its records."""
    for path in reversed(journal_files(bookie_dir)):
        used = _used_bytes(path)
        if used > HEADER_BYTES:
            cut = rng.randrange(HEADER_BYTES, used)
            os.truncate(path, cut)
            return f"truncated {path.name} at {cut} of {used}"
    return "no journal records to truncate"


def tear_journal_tail(bookie_dir: Path, rng: random.Random) -> str:
    """Overwrite a random stretch at the end of the newest records with zeros or garbage."""
    for path in reversed(journal_files(bookie_dir)):
        used = _used_bytes(path)
        if used > HEADER_BYTES + 64:
            start = rng.randrange(max(HEADER_BYTES, used - 512), used)
            junk = bytes(rng.getrandbits(8) for _ in range(used - start))
            with path.open("r+b") as file:
                file.seek(start)
                file.write(junk if rng.random() < 0.5 else bytes(len(junk)))
            return f"tore {path.name} from {start} to {used}"
    return "no journal records to tear"


def flip_journal_bits(bookie_dir: Path, rng: random.Random, flips: int = 1) -> str:
    """Flip bits inside the records of the oldest non-empty journal file (not its tail)."""
    for path in journal_files(bookie_dir):
        used = _used_bytes(path)
        if used > HEADER_BYTES + 256:
            data = bytearray(path.read_bytes())
            where = []
            for _ in range(flips):
                offset = rng.randrange(HEADER_BYTES, used - 128)
                data[offset] ^= 1 << rng.randrange(8)
                where.append(offset)
            path.write_bytes(bytes(data))
            return f"flipped bits of {path.name} at {where}"
    return "no journal records to flip"


@contextlib.contextmanager
def tmpfs(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a size-limited tmpfs (ENOSPC when full); skip the test when not permitted."""
    mount_point.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)
