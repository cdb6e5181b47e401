"""`--metrics-port` of `bkaio autorecovery` (and `bkaio standalone`, test_standalone_bad_places.py)
on a port another process holds, or `--metrics-host` that does not resolve: one line naming the
option and the address, not a bare "OSError: [Errno 98] Address already in use"."""

from __future__ import annotations

import socket

import pytest

from bkaio.cli.main import main

SQLITE = "sqlite:////proc/nonexistent/meta.db"  # Never reached: the server starts first.


def test_autorecovery_names_a_metrics_port_in_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKAIO_ADMIN_TOKEN", "t")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["autorecovery", "--metadata", SQLITE, "--metrics-port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"bkaio: ConfigError: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: "
    ), err


def test_autorecovery_names_a_metrics_host_that_does_not_resolve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BKAIO_ADMIN_TOKEN", "t")
    args = ["--metadata", SQLITE, "--metrics-port", "9", "--metrics-host", "256.0.0.1"]
    assert main(["autorecovery", *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bkaio: ConfigError: --metrics-port 9: cannot listen on 256.0.0.1:9: ")
