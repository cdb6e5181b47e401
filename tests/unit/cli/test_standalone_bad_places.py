"""`bkaio standalone` on a data directory it cannot use, or with a --metrics-port another
process holds: one line naming the option and the reason, no traceback, no process started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from bkaio.cli.main import main


@pytest.mark.parametrize("where", ["through-a-file", "under-proc"])
def test_a_data_directory_that_cannot_be_made_is_a_usage_error(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("kept\n")
    # Root can write anywhere but in a path through a file and in /proc.
    data_dir = tmp_path / "a-file" / "sub" if where == "through-a-file" else Path("/proc/bkaio")
    assert main(["standalone", "--data-dir", str(data_dir), "--bookies", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("bkaio: UsageError: Invalid value for '--data-dir': "), err
    assert f"{str(data_dir)!r} cannot hold a cluster: " in err, err
    assert (tmp_path / "a-file").read_text() == "kept\n"


def test_a_metrics_port_in_use_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--data-dir", str(tmp_path / "sa"), "--bookies", "1", "--metrics-port", str(port)]
        assert main(["standalone", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"bkaio: ConfigError: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: "
    ), err
    assert not list((tmp_path / "sa").glob("bookie-*")), "no bookie was started"
