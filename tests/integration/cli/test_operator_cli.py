"""The operator commands (issue 26 section 1, CLI-wide rules) through the real `bkaio` command,
against one real standalone cluster for the whole module (3 bookies, SQLite metadata)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bkaio.bookie.offline import (
    JournalEnd,
    entry_log_path,
    list_files,
    read_entry_log,
    read_journal,
)
from bkaio.cli.main import main
from bkaio.config import load_bookie_config
from bkaio.errors import NotEnoughBookiesError
from bkaio.ledger_client import LedgerHandle
from tests.fixtures.standalone import (
    Standalone,
    bkaio,
    bkaio_json,
    standalone_cluster,
    write_test_ledger,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    yield from standalone_cluster(tmp_path_factory, bookies=3)


@pytest.fixture(scope="module")
def ledger_id(cluster: Standalone) -> int:
    """A closed ledger of 10 entries ("entry 0".."entry 9", password "pw") on E3 Qw2."""
    return write_test_ledger(cluster.uri)


def one_line_usage_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""


# -- cluster commands --------------------------------------------------------------------------


def test_clusterinfo_reports_the_running_cluster(cluster: Standalone, ledger_id: int) -> None:
    info = bkaio_json("shell", "clusterinfo", "--metadata", cluster.uri)
    assert len(info["instance_id"]) == 32
    assert sorted(info["writable_bookies"]) == sorted(cluster.bookie_id(i) for i in range(3))
    assert info["read_only_bookies"] == [] and info["unavailable_bookies"] == []
    assert info["ledgers"] >= 1 and info["under_replicated_ledgers"] == 0
    assert info["totalBookiesCount"] == 3 and info["writableBookiesCount"] == 3
    text = bkaio("shell", "clusterinfo", "--metadata", cluster.uri)
    assert text.returncode == 0 and info["instance_id"] in text.stdout


def test_a_running_cluster_cannot_be_nuked_or_formatted(cluster: Standalone) -> None:
    instance_id = bkaio_json("shell", "clusterinfo", "--metadata", cluster.uri)["instance_id"]
    for args in (
        ("nukeexistingcluster", "--instance-id", instance_id),
        ("metaformat", "--force"),
    ):
        refused = bkaio("shell", *args, "--json", "--metadata", cluster.uri)
        assert refused.returncode == 1, refused.stderr
        assert json.loads(refused.stderr)["kind"] == "ClusterInUseError"
    assert bkaio_json("shell", "clusterinfo", "--metadata", cluster.uri)["ledgers"] >= 0


def test_cluster_lifecycle_on_empty_metadata(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'meta.db'}"
    missing = bkaio("shell", "clusterinfo", "--json", "--metadata", uri)
    assert missing.returncode == 1
    assert json.loads(missing.stderr)["kind"] == "ClusterNotInitialisedError"
    assert "initnewcluster" in json.loads(missing.stderr)["error"]

    created = bkaio_json("shell", "initnewcluster", "--instance-id", "first", "--metadata", uri)
    assert created["instance_id"] == "first"
    again = bkaio("shell", "initnewcluster", "--metadata", uri)
    assert again.returncode == 1 and "ClusterExistsError" in again.stderr
    assert bkaio_json("shell", "clusterinfo", "--metadata", uri)["instance_id"] == "first"

    unforced = bkaio("shell", "metaformat", "--metadata", uri)
    assert unforced.returncode == 1 and "--force" in unforced.stderr
    formatted = bkaio_json("shell", "metaformat", "--force", "--metadata", uri)
    assert formatted["instance_id"] != "first"

    one_line_usage_error(bkaio("shell", "nukeexistingcluster", "--metadata", uri))
    wrong = bkaio("shell", "nukeexistingcluster", "--instance-id", "first", "--metadata", uri)
    assert wrong.returncode == 1 and "InstanceIdMismatchError" in wrong.stderr
    nuked = bkaio_json(
        "shell", "nukeexistingcluster", "--instance-id", formatted["instance_id"], "--metadata", uri
    )
    assert nuked["instance_id"] == formatted["instance_id"] and nuked["keys_deleted"] >= 2
    assert bkaio("shell", "clusterinfo", "--metadata", uri).returncode == 1
    assert bkaio_json("shell", "metaformat", "--metadata", uri)["formatted"] is True


# -- bookies -----------------------------------------------------------------------------------


def _admin_get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_free_space_has_one_definition(cluster: Standalone) -> None:
    listed = bkaio_json("shell", "listbookies", "--metadata", cluster.uri)
    assert [b["state"] for b in listed] == ["writable"] * 3
    info = bkaio_json("shell", "bookieinfo", "--metadata", cluster.uri)
    assert info["total_free_bytes"] == sum(b["free_bytes"] for b in info["bookies"])
    one = bkaio_json("shell", "bookieinfo", cluster.bookie_id(0), "--metadata", cluster.uri)
    assert [b["bookie_id"] for b in one["bookies"]] == [cluster.bookie_id(0)]
    rest = _admin_get(cluster.admin_url(0) + "/api/v1/bookie/info")
    offline = bkaio_json("bookie", "info", "--config", cluster.bookie_config(0))
    # The same filesystem measured seconds apart by four paths: totals identical, free space
    # within what this shared box wrote meanwhile. The two definitions this replaced (size
    # minus used, and available blocks) differ by the filesystem's reserved blocks: 5% of it,
    # gigabytes, on ext4.
    totals = {
        rest["totalSpace"],
        offline["total_bytes"],
        one["bookies"][0]["total_bytes"],
        listed[0]["total_bytes"],
    }
    assert len(totals) == 1
    frees = [rest["freeSpace"], offline["free_bytes"], one["bookies"][0]["free_bytes"]]
    assert max(frees) - min(frees) < 2 * 1024**3
    assert 0 < rest["freeSpace"] <= rest["totalSpace"]


def test_bookiesanity_uses_only_the_named_bookie(cluster: Standalone) -> None:
    target = cluster.bookie_id(1)
    before = set(bkaio_json("shell", "listledgers", "--metadata", cluster.uri))
    report = bkaio_json(
        "shell", "bookiesanity", target, "--entries", "5", "--metadata", cluster.uri
    )
    assert report["bookie_id"] == target and report["entries"] == 5 and report["ok"] is True
    assert set(bkaio_json("shell", "listledgers", "--metadata", cluster.uri)) == before
    # Only that bookie journaled the ledger's entries (GC has not run yet): read them offline.
    mine = [r for r in _journal(cluster, 1) if r.get("ledger_id") == report["ledger_id"]]
    assert [r["entry_id"] for r in mine if r["kind"] == "entry"] == [0, 1, 2, 3, 4]
    for other in (0, 2):
        assert not [
            r for r in _journal(cluster, other) if r.get("ledger_id") == report["ledger_id"]
        ]
    unknown = bkaio("shell", "bookiesanity", "127.0.0.1:9", "--metadata", cluster.uri)
    assert unknown.returncode == 1 and "UnknownBookieError" in unknown.stderr


def test_simpletest_that_fails_half_way_closes_and_deletes_its_ledger(
    cluster: Standalone, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24 section 4: the 4th append fails; the command says so in one line, and the
    ledger it made is closed and deleted (in-process, so that the test can make the append
    fail; the cluster is real)."""
    before = set(bkaio_json("shell", "listledgers", "--metadata", cluster.uri))
    made: list[LedgerHandle] = []
    real_append = LedgerHandle.append

    def append_failing_at_the_fourth(handle: LedgerHandle, payload: bytes) -> Any:
        if handle not in made:
            made.append(handle)
        if handle.last_add_pushed < 2:
            return real_append(handle, payload)
        failed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        failed.set_exception(NotEnoughBookiesError("injected by the test: the 4th append"))
        return failed

    monkeypatch.setattr(LedgerHandle, "append", append_failing_at_the_fourth)
    code = main(["shell", "simpletest", "--entries", "10", "--metadata", cluster.uri])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip() == "bkaio: NotEnoughBookiesError: injected by the test: the 4th append"
    assert len(made) == 1 and made[0].is_closed
    monkeypatch.undo()
    assert set(bkaio_json("shell", "listledgers", "--metadata", cluster.uri)) == before


# -- offline tools on a bookie's directories -------------------------------------------------


def _journal(cluster: Standalone, bookie: int) -> list[dict[str, Any]]:
    """Every record of every journal file of a bookie (read in process: the commands that
    read journals have their own test below)."""
    config = load_bookie_config(cluster.bookie_config(bookie))
    records: list[dict[str, Any]] = []
    for file in list_files(config, ("journal",)):
        records.extend(read_journal(Path(file.path), JournalEnd()))
    return records


def _holders(cluster: Standalone, ledger_id: int) -> list[int]:
    metadata = bkaio_json("shell", "ledgermetadata", str(ledger_id), "--metadata", cluster.uri)
    ensemble = metadata["ensembles"][0][1]
    return [i for i in range(3) if cluster.bookie_id(i) in ensemble]


def _flushed_records(cluster: Standalone, bookie: int, ledger_id: int) -> list[dict[str, Any]]:
    """The ledger's records in the bookie's entry log 0, once its write cache was flushed."""
    config = load_bookie_config(cluster.bookie_config(bookie))
    log = entry_log_path(config, "0")
    deadline = time.monotonic() + 30
    while not (log.exists() and list(read_entry_log(log, ledger_id=ledger_id))):
        assert time.monotonic() < deadline, f"ledger {ledger_id} never flushed to {log}"
        time.sleep(0.2)
    records: list[dict[str, Any]] = bkaio_json(
        "bookie", "readentrylog", "0", "--ledgerid", str(ledger_id), "--msg",
        "--config", cluster.bookie_config(bookie),
    )  # fmt: skip
    return records


def test_offline_tools_read_a_running_bookie(cluster: Standalone, ledger_id: int) -> None:
    bookie = _holders(cluster, ledger_id)[0]
    config = cluster.bookie_config(bookie)
    records = _flushed_records(cluster, bookie, ledger_id)
    assert {r["payload"] for r in records} <= {f"entry {i}" for i in range(10)}
    assert all(r["size"] > r["payload_bytes"] for r in records)

    marks = bkaio_json("bookie", "lastmark", "--config", config)
    assert len(marks) == 1 and marks[0]["shard"] == 0 and marks[0]["file_id"] >= 1

    files = bkaio_json("bookie", "listfilesondisc", "--config", config)
    assert {f["kind"] for f in files} == {"journal", "entrylog", "index"}
    journals = bkaio_json("bookie", "listfilesondisc", "--journal", "--config", config)
    assert journals and {f["kind"] for f in journals} == {"journal"}

    journal = bkaio_json(
        "bookie", "readjournal", Path(journals[0]["path"]).name, "--config", config
    )
    kinds = {(r["kind"], r.get("ledger_id")) for r in journal["records"]}
    assert ("master_key", ledger_id) in kinds and ("entry", ledger_id) in kinds
    assert journal["count"] == len(journal["records"]) and journal["corruption"] == []
    assert all("key" not in r or r["kind"] != "master_key" for r in journal["records"])

    first = records[0]
    single = bkaio_json(
        "bookie", "readentrylog", "00000000.log", "--ledgerid", str(ledger_id),
        "--entryid", str(first["entry_id"]), "--config", config,
    )  # fmt: skip
    assert [r["entry_id"] for r in single] == [first["entry_id"]]
    text = bkaio("bookie", "readentrylog", "0", "--config", config, "--msg")
    assert text.returncode == 0 and f"ledger={ledger_id}" in text.stdout

    check = bkaio_json("bookie", "localconsistencycheck", "--config", config)
    assert check["ok"] is True and check["problem_count"] == 0
    rows = {row["ledger_id"]: row for row in check["ledgers"]}
    assert rows[ledger_id]["entries"] == len(records) and rows[ledger_id]["ok"] is True
    human = bkaio("bookie", "localconsistencycheck", "--config", config)
    assert human.returncode == 0 and "LEDGER_ID" in human.stdout


def test_offline_tools_refuse_bad_arguments_with_exit_2(cluster: Standalone) -> None:
    # Every argument's check is in tests/unit/cli/test_arguments.py; these go through the
    # console script and a real bookie's configuration.
    config = cluster.bookie_config(0)
    for args in (("readjournal", "99999"), ("readentrylog", "0", "--shard", "3")):
        one_line_usage_error(bkaio("bookie", *args, "--config", config))


def test_updatecookie_refuses_a_running_bookie(cluster: Standalone) -> None:
    done = bkaio("bookie", "updatecookie", "--directories", "--config", cluster.bookie_config(2))
    assert done.returncode == 1 and "BookieRunningError" in done.stderr


# -- CLI-wide rules ----------------------------------------------------------------------------


def test_bad_arguments_exit_2_with_one_line(cluster: Standalone) -> None:
    # The whole matrix runs in-process in tests/unit/cli/test_arguments.py.
    env = {"BKAIO_METADATA": cluster.uri}
    for args in (("shell", "readledger", "-1"), ("shell", "ledgermetadata", "-5")):
        done = bkaio(*args, env=env)
        one_line_usage_error(done)
        assert "-" in done.stderr and "not in the range" in done.stderr


def test_usage_errors_under_json_are_json(cluster: Standalone) -> None:
    env = {"BKAIO_METADATA": cluster.uri}
    for args in (("bookie", "lastmark"), ("shell", "nosuch")):
        done = bkaio(*args, "--json", env=env)
        assert done.returncode == 2 and done.stdout == ""
        error = json.loads(done.stderr)
        assert error["kind"] == "UsageError" and error["error"]


def test_errors_under_json_are_json_objects_with_the_same_exit_code(cluster: Standalone) -> None:
    args = ("shell", "ledgermetadata", "987654321", "--metadata", cluster.uri)
    text = bkaio(*args)
    as_json = bkaio(*args, "--json")
    assert text.returncode == as_json.returncode == 1
    assert as_json.stdout == ""
    assert json.loads(as_json.stderr) == {
        "error": "ledger 987654321 has no metadata",
        "kind": "NoSuchLedgerError",
    }
    assert text.stderr.strip() == "bkaio: NoSuchLedgerError: ledger 987654321 has no metadata"


def test_tables_are_whole_lines_when_piped(cluster: Standalone) -> None:
    done = bkaio("shell", "listbookies", "--metadata", cluster.uri)
    lines = done.stdout.splitlines()
    columns = "BOOKIE_ID STATE JOURNAL_SYNC RACK SHARDS FREE_BYTES TOTAL_BYTES ADMIN_URL"
    assert lines[0].split() == columns.split()
    assert len(lines) == 4 and all(len(line.split()) == len(columns.split()) for line in lines[1:])
    assert cluster.admin_url(0) in done.stdout
