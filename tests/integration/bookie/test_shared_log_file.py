"""A bookie's parent and its shard workers write one log file (the service's stderr): every
line must stay whole however long it is. structlog's PrintLogger wrote a line and its newline
as two writes, so a line past the stream's 8 KiB chunk (an ERROR with its traceback) left
the process without its newline and the other process's line landed in the middle of it;
a test then missed `bookie_unhealthy` in the log. `configure_logging` writes each line once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

_WRITER = """
import os, sys, time
sys.stderr = open(sys.argv[1], "a", encoding="utf-8", buffering=1)
import structlog
from bkaio.logs import configure_logging
configure_logging(json=True)
log = structlog.get_logger()
open(sys.argv[3] + "-" + sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):  # Both start together, so that their writes overlap.
    time.sleep(0.001)
for i in range(300):
    log.error("long_line", writer=sys.argv[2], i=i, blob="x" * 20000)
    log.info("short_line", writer=sys.argv[2], i=i)
"""


def test_two_processes_appending_long_lines_to_one_file_keep_every_line_whole(
    tmp_path: Path,
) -> None:
    log_file, go = tmp_path / "bookie.log", tmp_path / "go"
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(log_file), name, str(go)])
        for name in ("parent", "shard-0")
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go-{name}").exists() for name in ("parent", "shard-0")):
        assert time.monotonic() < deadline and all(w.poll() is None for w in writers)
        time.sleep(0.01)
    go.touch()
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    lines = log_file.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]  # Raises on a broken line.
    assert len(events) == 2 * 2 * 300
    for name in ("parent", "shard-0"):
        mine = [e for e in events if e["writer"] == name and e["event"] == "long_line"]
        assert [e["i"] for e in mine] == list(range(300))
        assert all(len(e["blob"]) == 20000 for e in mine)
