"""`bkaio standalone --base-port BASE`: the ports a standalone cluster listens on can be given
(parallel test workers each give theirs, from their own port window), etcd's included; a bad
BASE is one line and exit 2 before anything is made; a data directory keeps its first ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.cli.main import main
from bkaio.cli.standalone_layout import STATE_FILE, load_layout, port_offsets
from bkaio.errors import ConfigError


@pytest.mark.parametrize("base", ["-5", "abc", "4O00", "80", "1023", "65335", "70000", "", "1e4"])
def test_a_bad_base_port_is_refused_before_anything_starts(
    base: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "standalone"
    # A store that cannot be opened: a BASE let through fails fast instead of serving.
    nowhere = "sqlite:////proc/nonexistent/meta.db"  # Not even root can make it.
    args = ["--data-dir", str(data_dir), "--metadata", nowhere, "--base-port", base]
    assert main(["standalone", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"'--base-port': {base!r} is not a base port: want 1024..65334" in err, err
    assert not data_dir.exists()


@pytest.mark.parametrize("etcd", [False, True], ids=["sqlite", "etcd"])
def test_every_port_follows_the_base(tmp_path: Path, etcd: bool) -> None:
    layout = load_layout(tmp_path, 3, None, etcd, 20_000, False)
    assert layout.bookie_ports == [20_000, 20_001, 20_002]
    assert layout.admin_ports == [20_100, 20_101, 20_102]
    if etcd:  # The local etcd too: nothing of the cluster is left to a free-port pick.
        assert (layout.etcd_client_port, layout.etcd_peer_port) == (20_200, 20_201)
        assert layout.metadata_uri == "etcd://127.0.0.1:20200/bkaio"
    assert layout.ports() == [20_000 + offset for offset in port_offsets(3, etcd)]
    # The highest base still fits the plan below 65536.
    highest = load_layout(tmp_path / "high", 32, None, True, 65_334, False)
    assert max(highest.ports()) == 65_535


def test_a_data_directory_keeps_its_ports_and_refuses_other_ones(tmp_path: Path) -> None:
    first = load_layout(tmp_path, 2, None, True, 20_000, False)
    assert load_layout(tmp_path, 2, None, True, 20_000, False) == first
    assert load_layout(tmp_path, 2, None, True, 0, False) == first  # No --base-port: kept.
    before = (tmp_path / STATE_FILE).read_text()
    with pytest.raises(ConfigError, match="without --base-port") as refused:
        load_layout(tmp_path, 2, None, True, 30_000, False)
    assert str(refused.value).startswith(f"{tmp_path} was created with other ports")
    assert (tmp_path / STATE_FILE).read_text() == before
