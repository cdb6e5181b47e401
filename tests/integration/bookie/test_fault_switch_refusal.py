"""Production processes read no test switch: started with a retired fault-injection variable in
their environment (BKAIO_MUTATION, BKAIO_FAULT_DISK, BKAIO_CRASHPOINT) they refuse to start,
with exit code 2 and one line on stderr naming the test entry point. Real processes, each
through its real entry point; a refused bookie has touched neither its directories nor its
metadata store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bkaio.fault_switches import RETIRED_FAULT_SWITCHES, TEST_ENTRY_POINT
from tests.fixtures.bookies import write_toml

BKAIO = str(Path(sys.executable).parent / "bkaio")
REPO = Path(__file__).resolve().parents[3]
SWITCH_VALUES = {
    "BKAIO_MUTATION": "ack_before_fsync",
    "BKAIO_FAULT_DISK": "lazy",
    "BKAIO_CRASHPOINT": "journal.after_write_before_sync:1",
}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RETIRED_FAULT_SWITCHES}
    env.pop("NOTIFY_SOCKET", None)
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False
    )


def _bookie_config(tmp_path: Path) -> Path:
    """A bookie that would start: free of port clashes (port 0 is not allowed, so a high one),
    SQLite metadata in tmp_path."""
    config = tmp_path / "bookie.toml"
    write_toml(
        config,
        {
            "bookie": {"host": "127.0.0.1", "port": 39_181, "shards": 1},
            "metadata": {"uri": f"sqlite://{tmp_path / 'meta.db'}"},
            "admin": {"enabled": False},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
        },
    )
    return config


def _assert_refused(done: subprocess.CompletedProcess[str], switch: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert switch in lines[0] and TEST_ENTRY_POINT in lines[0], lines[0]
    assert "refusing to start" in lines[0]


@pytest.mark.parametrize("switch", RETIRED_FAULT_SWITCHES)
@pytest.mark.parametrize(
    "entry",
    ["bkaio bookie", "python -m bkaio.bookie", "python -m bkaio.testing.bookie"],
)
def test_a_bookie_with_a_fault_switch_refuses_to_start(
    tmp_path: Path, entry: str, switch: str
) -> None:
    config = _bookie_config(tmp_path)
    command = {
        "bkaio bookie": [BKAIO, "bookie", "--config", str(config)],
        "python -m bkaio.bookie": [sys.executable, "-m", "bkaio.bookie", "--config", str(config)],
        # The test entry point takes its faults as options: a variable would be ignored there,
        # so it refuses too (the harness must not think it injected something).
        "python -m bkaio.testing.bookie": [
            sys.executable,
            "-m",
            "bkaio.testing.bookie",
            "--disk",
            "lazy",
            "--config",
            str(config),
        ],
    }[entry]
    done = _run(command, _clean_env(**{switch: SWITCH_VALUES[switch]}))
    _assert_refused(done, switch)
    assert not (tmp_path / "meta.db").exists(), "it opened its metadata store"
    assert not (tmp_path / "journal").exists(), "it created its journal directory"


def test_an_empty_switch_is_refused_and_several_are_named(tmp_path: Path) -> None:
    config = _bookie_config(tmp_path)
    command = [sys.executable, "-m", "bkaio.bookie", "--config", str(config)]
    done = _run(command, _clean_env(BKAIO_CRASHPOINT=""))
    _assert_refused(done, "BKAIO_CRASHPOINT")
    done = _run(command, _clean_env(BKAIO_MUTATION="x", BKAIO_FAULT_DISK="lazy"))
    _assert_refused(done, "BKAIO_MUTATION and BKAIO_FAULT_DISK")


@pytest.mark.parametrize(
    "entry", ["python -m bkaio.bookie.worker", "python -m bkaio.testing.bookie.worker"]
)
def test_a_shard_worker_with_a_fault_switch_refuses_to_start(tmp_path: Path, entry: str) -> None:
    config = _bookie_config(tmp_path)
    module = entry.split()[-1]
    command = [sys.executable, "-m", module, "--config", str(config), "--shard", "0"]
    done = _run(command, _clean_env(BKAIO_MUTATION="ack_before_fsync"))
    _assert_refused(done, "BKAIO_MUTATION")
    assert not (tmp_path / "journal").exists()


def test_standalone_with_a_fault_switch_refuses_to_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "standalone"
    done = _run(
        [BKAIO, "standalone", "--bookies", "1", "--data-dir", str(data_dir)],
        _clean_env(BKAIO_FAULT_DISK="lazy"),
    )
    _assert_refused(done, "BKAIO_FAULT_DISK")
    assert not data_dir.exists(), "it laid out a cluster"


def test_autorecovery_with_a_fault_switch_refuses_to_start(tmp_path: Path) -> None:
    done = _run(
        [BKAIO, "autorecovery", "--metadata", f"sqlite://{tmp_path / 'meta.db'}"],
        _clean_env(BKAIO_MUTATION="no_fence_on_recovery_reads"),
    )
    _assert_refused(done, "BKAIO_MUTATION")
    assert not (tmp_path / "meta.db").exists()


def test_the_test_entry_point_refuses_a_bad_injection(tmp_path: Path) -> None:
    config = _bookie_config(tmp_path)
    for options, complaint in (
        (["--disk", "lazy,fast=1"], "bad item"),
        (["--crash-point", "journal.nowhere:2"], "unknown crash point"),
        (["--mutation", "no_fence_on_recovery_reads"], "unknown bookie mutation"),
    ):
        done = _run(
            [sys.executable, "-m", "bkaio.testing.bookie", *options, "--config", str(config)],
            _clean_env(),
        )
        assert done.returncode == 2, (options, done.stderr)
        assert complaint in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "journal").exists()
