"""CPU accounting from /proc and the hot-spot summary of py-spy's raw output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bkaio.bench import procstat
from bkaio.bench.profiling import top_inclusive_frames, top_self_frames


def test_own_cpu_time_grows_with_work() -> None:
    before = procstat.process_cpu_seconds(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert procstat.process_cpu_seconds(os.getpid()) >= before


def test_a_process_tree_includes_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in procstat.tree_pids(os.getpid())
        snapshot = procstat.tree_cpu_seconds(os.getpid())
        assert set(snapshot) >= {os.getpid(), child.pid}
    finally:
        child.kill()
        child.wait()


def test_cpu_delta_counts_new_processes_whole() -> None:
    assert procstat.cpu_delta({1: 1.0, 2: 5.0}, {1: 1.5, 3: 0.25}) == pytest.approx(0.75)


def test_a_vanished_process_is_a_bk_error() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(procstat.ProcStatError, match=f"/proc/{child.pid}/stat"):
        procstat.process_cpu_seconds(child.pid)
    assert procstat.tree_cpu_seconds(child.pid) == {}


RAW = """\
main (app.py:1);loop (app.py:5);send (net.py:10) 60
main (app.py:1);loop (app.py:5);encode (codec.py:3) 30
main (app.py:1);gc (app.py:9) 10
garbage line
"""


def test_top_self_frames_ranks_the_leaves() -> None:
    assert top_self_frames(RAW) == [
        ("send (net.py:10)", 60.0),
        ("encode (codec.py:3)", 30.0),
        ("gc (app.py:9)", 10.0),
    ]
    assert top_self_frames("") == []


def test_top_inclusive_frames_counts_each_stack_once() -> None:
    inclusive = dict(top_inclusive_frames(RAW))
    assert inclusive["main (app.py:1)"] == 100.0
    assert inclusive["loop (app.py:5)"] == 90.0
