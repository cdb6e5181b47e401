"""`bkaio standalone` whose bookie cannot start says why: the bookie's error, not the info line
its orderly stop logs after it (which is what the last line of its log is)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from bkaio.cli.standalone import SupervisedBookie
from bkaio.cli.standalone_layout import port_offsets
from bkaio.localproc import LOOPBACK, free_base_port

BKAIO = str(Path(sys.executable).parent / "bkaio")


def _occupied_base_port() -> tuple[socket.socket, int]:
    """A base port of a one-bookie standalone, from this worker's window, with something
    listening on the bookie's port (its admin port, BASE + 100, stays free)."""
    port = free_base_port(port_offsets(1, etcd=False))
    taken = socket.socket()
    try:
        taken.bind((LOOPBACK, port))
        taken.listen()
    except OSError:
        taken.close()
        raise
    return taken, port


def test_a_bookie_port_in_use_is_the_error(tmp_path: Path) -> None:
    taken, port = _occupied_base_port()
    data_dir = tmp_path / "standalone"
    with taken:
        done = subprocess.run(
            [
                BKAIO,
                "standalone",
                "--bookies",
                "1",
                "--base-port",
                str(port),
                "--data-dir",
                data_dir,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert "address already in use" in done.stderr, done.stderr
    assert f"cannot listen on {port}" in done.stderr, done.stderr


def _line(level: str, event: str, **fields: object) -> str:
    return json.dumps({"event": event, "level": level, **fields})


def test_the_reason_is_this_runs_last_error(tmp_path: Path) -> None:
    config = tmp_path / "bookie-0" / "bookie.toml"
    config.parent.mkdir()
    bookie = SupervisedBookie(0, config)
    earlier_run = _line("error", "bookie_start_failed", error="an earlier run's error") + "\n"
    this_run = [
        _line("info", "journal_opened"),
        _line("error", "shard_start_failed", error="shard 0: cannot listen on 3181"),
        _line("info", "journal_closed"),
    ]
    bookie.log_path.write_text(earlier_run + "\n".join(this_run) + "\n")
    bookie.log_offset = len(earlier_run.encode())
    assert bookie.exit_reason() == "shard_start_failed: shard 0: cannot listen on 3181"
    # No error logged in this run (a traceback, a refusal printed as text): its last line.
    bookie.log_path.write_text(earlier_run + _line("info", "x") + "\nbkaio bookie: refused\n")
    assert bookie.exit_reason() == "bkaio bookie: refused"
