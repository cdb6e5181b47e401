"""The `bkaio` command through its real entry point, against a real `bkaio standalone` cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.etcd import initialise_cluster_blocking
from tests.fixtures.standalone import Standalone, bkaio

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path / "standalone")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_standalone_simpletest_json_and_restart_keeps_ledgers(standalone: Standalone) -> None:
    done = bkaio("shell", "simpletest", "--entries", "50", "--metadata", standalone.uri)
    assert done.returncode == 0, done.stderr
    assert "simpletest passed" in done.stdout

    report = json.loads(bkaio("shell", "simpletest", "--json", "--metadata", standalone.uri).stdout)
    assert report["entries"] == 100 and report["quorums"] == [3, 3, 2]

    bookies = json.loads(
        bkaio("shell", "listbookies", "--json", "--metadata", standalone.uri).stdout
    )
    assert len(bookies) == 3 and all(b["state"] == "writable" for b in bookies)
    assert all(b["free_bytes"] > 0 for b in bookies)

    # A ledger written now must survive a restart of the whole standalone cluster.
    env = {"BKAIO_METADATA": standalone.uri}
    written = subprocess.run(
        [sys.executable, str(REPO / "tests/integration/cli/write_ledger.py")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )
    assert written.returncode == 0, written.stderr
    ledger_id = int(written.stdout.strip())
    assert standalone.stop() == 0

    standalone.start()
    listed = json.loads(bkaio("shell", "listledgers", "--json", env=env).stdout)
    assert ledger_id in listed
    metadata = json.loads(
        bkaio("shell", "ledgermetadata", str(ledger_id), "--json", env=env).stdout
    )
    assert metadata["state"] == "CLOSED" and metadata["last_entry_id"] == 9
    assert "password_hash" not in metadata
    entries = json.loads(
        bkaio("shell", "readledger", str(ledger_id), "--password", "pw", "--json", env=env).stdout
    )
    assert [e["payload"] for e in entries] == [f"entry {i}" for i in range(10)]

    text = bkaio("shell", "readledger", str(ledger_id), "2", "3", "--password", "pw", env=env)
    assert text.stdout.splitlines() == ["2\tentry 2", "3\tentry 3"]

    deleted = bkaio("shell", "deleteledger", str(ledger_id), env=env)
    assert deleted.returncode == 0, deleted.stderr
    gone = bkaio("shell", "ledgermetadata", str(ledger_id), env=env)
    assert gone.returncode == 1
    assert gone.stderr.count("\n") == 1 and "Traceback" not in gone.stderr
    assert "NoSuchLedger" in gone.stderr


def test_quickstart_example_runs(standalone: Standalone) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples/quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "BKAIO_METADATA": standalone.uri},
    )
    assert done.returncode == 0, done.stderr
    assert "first entries: ['event 0', 'event 1', 'event 2']" in done.stdout


def test_expected_errors_are_one_line_without_traceback(standalone: Standalone) -> None:
    cases = [
        ("shell", "ledgermetadata", "987654321", "--metadata", standalone.uri),
        ("shell", "readledger", "987654321", "--metadata", standalone.uri),
        ("shell", "readledger", "x", "--metadata", standalone.uri),
        ("shell", "listledgers", "--metadata", "nosuchscheme://what"),
        ("shell", "simpletest", "--ensemble-size", "5", "--metadata", standalone.uri),
    ]
    for args in cases:
        done = bkaio(*args)
        assert done.returncode != 0, args
        assert done.stderr.count("\n") == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr, args


def test_unreachable_etcd_is_a_one_line_error() -> None:
    done = bkaio("shell", "listledgers", "--metadata", "etcd://127.0.0.1:9/bkaio", timeout=180)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_bookie_format_refuses_to_wipe_data_without_force(tmp_path: Path) -> None:
    data = tmp_path / "bookie"
    config = tmp_path / "bookie.toml"
    config.write_text(
        "\n".join(
            [
                "[bookie]",
                'host = "127.0.0.1"',
                "port = 45181",
                "shards = 1",
                "[metadata]",
                f'uri = "sqlite:///{tmp_path / "meta.db"}"',
                "[storage]",
                f'journal_dirs = ["{data / "journal"}"]',
                f'ledger_dirs = ["{data / "ledgers"}"]',
                "",
            ]
        )
    )
    initialise_cluster_blocking(f"sqlite:///{tmp_path / 'meta.db'}")
    first = bkaio("bookie", "format", "--config", str(config), "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["wiped"] == []
    journal_dir = Path(json.loads(first.stdout)["directories"][0])
    (journal_dir / "data").write_bytes(b"x")
    refused = bkaio("bookie", "format", "--config", str(config))
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert (journal_dir / "data").exists()
    forced = bkaio("bookie", "format", "--config", str(config), "--force")
    assert forced.returncode == 0, forced.stderr
    assert not (journal_dir / "data").exists()
    info = json.loads(bkaio("bookie", "info", "--config", str(config), "--json").stdout)
    assert info["bookie_id"] == "127.0.0.1:45181" and info["shards"] == 1


def test_recover_of_an_unknown_bookie_fails_naming_it(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'meta.db'}"
    initialise_cluster_blocking(uri)
    done = bkaio(
        "shell", "recover", "127.0.0.1:1", "--metadata", uri, "--json", "--admin-token", "t"
    )
    assert done.returncode == 1 and "127.0.0.1:1" in done.stderr and "unknown" in done.stderr
    auditor = json.loads(bkaio("shell", "whoisauditor", "--json", "--metadata", uri).stdout)
    assert auditor == {"auditor": None}
    assert (
        json.loads(bkaio("shell", "listunderreplicated", "--json", "--metadata", uri).stdout) == []
    )


def test_standalone_tls_needs_the_client_certificate(tmp_path: Path) -> None:
    cluster = Standalone(tmp_path / "standalone", 2, "--tls")
    cluster.start()
    try:
        tls = cluster.description["tls"]
        assert isinstance(tls, dict)
        env = {
            "BKAIO_TLS_CA": tls["ca_file"],
            "BKAIO_TLS_CERT": tls["client_cert_file"],
            "BKAIO_TLS_KEY": tls["client_key_file"],
        }
        args = ("shell", "simpletest", "--entries", "20", "--json", "--metadata", cluster.uri)
        done = bkaio(*args, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["entries"] == 20
        bookies = json.loads(
            bkaio("shell", "listbookies", "--json", "--metadata", cluster.uri, env=env).stdout
        )
        assert all(b["free_bytes"] for b in bookies)
        # Without the client certificate the bookies refuse the connection.
        plain = bkaio(*args, env={"BKAIO_ADD_TIMEOUT": "2"}, timeout=180)
        assert plain.returncode != 0
        assert plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    finally:
        cluster.stop()
