"""`bkaio autorecovery` without the bookies' admin token says so when it starts, as a bookie
without admin.token does: its replication worker can copy nothing without it (every ledger
fails with HTTP 403s), which was otherwise only found in the failures that followed."""

from __future__ import annotations

import pytest

from bkaio.cli.main import main

# No cluster: the command stops after starting. Under /proc, where no run (even as root) can
# create the directory and so a cluster.
SQLITE = "sqlite:////proc/nonexistent/meta.db"


@pytest.mark.parametrize(("token", "warned"), [((), True), (("--admin-token", "t"), False)])
def test_a_missing_admin_token_is_warned_of(
    token: tuple[str, ...],
    warned: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BKAIO_ADMIN_TOKEN", raising=False)
    assert main(["autorecovery", "--metadata", SQLITE, *token]) == 1
    captured = capsys.readouterr()
    assert ("autorecovery_without_admin_token" in captured.out + captured.err) is warned, captured
