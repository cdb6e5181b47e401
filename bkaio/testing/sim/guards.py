"""The simulation's walls: no real thread, socket, sleep or subprocess is reachable inside it.

`sealed()` is active while a simulation runs. It replaces, for that time only:

- `threading.Thread.start`, `time.sleep`, socket creation and name lookups, `subprocess.Popen`
  with functions that raise `SimViolation`: code that would block the one thread, or escape
  the virtual clock, fails loudly instead of making the run nondeterministic;
- `os.open` / `os.close` and `lmdb.open` with versions that record which simulated process
  opened what (bkaio.testing.sim.process), so a crash can close a dead process's descriptors
  the way the kernel does.

The real code still opens real files by path: each simulated machine has its own directory.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import lmdb

from bkaio.testing.sim import process
from bkaio.testing.sim.loop import SimViolation

# Every refusal of the current (or last) sealed run: code may catch the exception, the runner
# still sees that it happened and fails the seed.
violations: list[str] = []


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        violations.append(what)
        raise SimViolation(f"{what} inside the simulation")

    return refused


@contextlib.contextmanager
def sealed() -> Iterator[None]:
    violations.clear()
    real_open, real_close, real_lmdb_open = os.open, os.close, lmdb.open

    def tracked_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        process.track_fd(fd)
        return fd

    def tracked_close(fd: int) -> None:
        process.untrack_fd(fd)
        real_close(fd)

    def tracked_lmdb_open(*args: Any, **kwargs: Any) -> Any:
        environment = real_lmdb_open(*args, **kwargs)
        process.track_closable(environment)
        return environment

    patches: list[tuple[Any, str, Any]] = [
        (threading.Thread, "start", _refuse("a real thread")),
        (time, "sleep", _refuse("time.sleep")),
        (socket.socket, "__init__", _refuse("a real socket")),
        (socket, "socketpair", _refuse("a real socket pair")),
        (socket, "create_connection", _refuse("a real connection")),
        (socket, "getaddrinfo", _refuse("a name lookup")),
        (subprocess.Popen, "__init__", _refuse("a subprocess")),
        (os, "open", tracked_open),
        (os, "close", tracked_close),
        (lmdb, "open", tracked_lmdb_open),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, replacement in patches:
            setattr(owner, name, replacement)
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
