"""CPU seconds of processes and process trees, read from /proc (Linux).

A bookie is a parent process plus one worker process per shard, so a server's CPU is the sum
over its process tree. Reading /proc is a few small file reads: callers on the event loop do it
once before and once after a measured phase, never per append.
"""

from __future__ import annotations

import os
from pathlib import Path

from bkaio.errors import BKError

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


class ProcStatError(BKError):
    """/proc does not say what we need (not Linux, or the process is gone)."""


def _stat_fields(pid: int) -> list[str]:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError as error:
        raise ProcStatError(f"cannot read /proc/{pid}/stat: {error.strerror}") from None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid` itself (all its threads), in seconds."""
    fields = _stat_fields(pid)
    # After the name: state(3) ppid(4) ... utime(14) stime(15); fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_SECOND


def children(pid: int) -> list[int]:
    """Direct children of `pid` (from every thread's children list)."""
    found: list[int] = []
    try:
        tasks = list((_PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def tree_pids(pid: int) -> list[int]:
    """`pid` and all its descendants alive now."""
    pids = [pid]
    index = 0
    while index < len(pids):
        pids.extend(children(pids[index]))
        index += 1
    return pids


def tree_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds of every live process of the tree rooted at `pid` (pid -> seconds).

    A process that exits between listing and reading is left out.
    """
    result: dict[int, float] = {}
    for member in tree_pids(pid):
        try:
            result[member] = process_cpu_seconds(member)
        except ProcStatError:
            continue
    return result


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two `tree_cpu_seconds` snapshots; processes born meanwhile count whole."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
