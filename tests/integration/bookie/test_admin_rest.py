"""The bookie admin REST API at BookKeeper parity (issue 26 section 2), on the HTTP endpoint of a
real bookie of one standalone cluster shared by the module: every /api/v1 path answers as
docs/operations.md documents it, bad parameters get a JSON 400 (never a 500), and modifying
endpoints answer 401 without the admin token and 403 with a wrong one."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.standalone import Standalone, standalone_cluster, write_test_ledger


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    yield from standalone_cluster(tmp_path_factory, bookies=3)


@pytest.fixture(scope="module")
def ledger_id(cluster: Standalone) -> int:
    return write_test_ledger(cluster.uri)


class Http:
    def __init__(self, cluster: Standalone, index: int = 0) -> None:
        self.base = cluster.admin_url(index)
        self.token = cluster.admin_token

    def call(
        self,
        path: str,
        method: str = "GET",
        body: Any = None,
        token: str | None = None,
        authorized: bool = False,
    ) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if authorized:
            token = self.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()

    def ok(self, path: str, **options: Any) -> Any:
        status, body = self.call(path, **options)
        assert status == 200, (path, status, body)
        return body


@pytest.fixture(scope="module")
def http(cluster: Standalone) -> Http:
    return Http(cluster)


def test_bookie_paths(cluster: Standalone, http: Http, ledger_id: int) -> None:
    ids = sorted(cluster.bookie_id(i) for i in range(3))
    assert sorted(http.ok("/api/v1/bookie/list_bookies")) == ids
    assert http.ok("/api/v1/bookie/list_bookies?type=ro") == {}
    named = http.ok("/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert set(named.values()) == {"127.0.0.1"}

    info = http.ok("/api/v1/bookie/list_bookie_info")
    assert sorted(k for k in info if k != "clusterInfo") == ids
    assert info["clusterInfo"]["total_free"] == sum(info[i]["free"] for i in ids)
    assert all(0 < info[i]["free"] <= info[i]["total"] for i in ids)

    mine = http.ok("/api/v1/bookie/info")
    assert mine["bookie_id"] == cluster.bookie_id(0)
    assert 0 < mine["freeSpace"] <= mine["totalSpace"] == info[cluster.bookie_id(0)]["total"]
    assert mine["shards"][0]["scrub"] == {"enabled": False}

    state = http.ok("/api/v1/bookie/state")
    assert state["running"] and not state["readOnly"] and not state["shuttingDown"]
    assert http.ok("/api/v1/bookie/state/readonly") == {"readOnly": False}
    assert http.ok("/api/v1/bookie/is_ready")["registered"] is True

    marks = http.ok("/api/v1/bookie/last_log_mark")
    ((journal_dir, mark),) = marks.items()
    assert journal_dir.startswith(str(cluster.data_dir)) and mark["shard"] == 0
    assert set(mark) == {"shard", "journal_dir", "file_id", "file", "offset"}  # None: no flush yet

    files = http.ok("/api/v1/bookie/list_disk_file")
    assert set(files) == {"journal files", "entrylog files", "index files"}
    assert files["journal files"] and all(f.endswith(".jnl") for f in files["journal files"])
    assert set(http.ok("/api/v1/bookie/list_disk_file?file_type=index")) == {"index files"}

    (details,) = http.ok("/api/v1/bookie/gc_details")
    assert details["shard_index"] == 0 and "majorCompactionCounter" in details
    assert http.ok("/api/v1/bookie/gc") == {"is_in_force_gc": False}

    summary = http.ok("/api/v1/bookie/cluster_info")
    assert summary["writableBookiesCount"] == 3 and summary["totalBookiesCount"] == 3
    assert summary["ledgers"] >= 1 and summary["clusterUnderReplicated"] is False
    assert summary["auditorElected"] == (summary["auditorId"] != "")

    config = http.ok("/api/v1/config/server_config")
    assert config["bookie_id"] == cluster.bookie_id(0)
    assert config["admin"]["token"] == "***" and cluster.admin_token not in json.dumps(config)
    assert config["storage"][0]["ledger_dirs"][0].startswith(str(cluster.data_dir))


def test_ledger_paths(http: Http, ledger_id: int) -> None:
    listed = http.ok("/api/v1/ledger/list")
    assert str(ledger_id) in listed and listed[str(ledger_id)] is None
    with_metadata = http.ok("/api/v1/ledger/list?print_metadata=true&page=1")
    assert with_metadata[str(ledger_id)]["state"] == "CLOSED"
    assert http.ok("/api/v1/ledger/list?print_metadata=true&page=99") == {}

    metadata = http.ok(f"/api/v1/ledger/metadata?ledger_id={ledger_id}")[str(ledger_id)]
    assert metadata["last_entry_id"] == 9 and "password_hash" not in metadata

    read = f"/api/v1/ledger/read?ledger_id={ledger_id}&password=pw"
    assert http.ok(read) == {str(i): f"entry {i}" for i in range(10)}
    assert http.ok(read + "&start_entry_id=3&end_entry_id=4") == {"3": "entry 3", "4": "entry 4"}
    assert http.ok(read + "&start_entry_id=8&end_entry_id=500") == {"8": "entry 8", "9": "entry 9"}
    assert http.ok(read + "&page=2") == {}
    status, body = http.call(f"/api/v1/ledger/read?ledger_id={ledger_id}&password=nope")
    assert status == 403 and body["kind"] == "UnauthorizedError"


def test_autorecovery_paths(http: Http) -> None:
    assert http.ok("/api/v1/autorecovery/status") == {"enabled": True}
    assert "auditor" in http.ok("/api/v1/autorecovery/who_is_auditor")
    assert http.ok("/api/v1/autorecovery/list_under_replicated_ledger") == []
    base = "/api/v1/autorecovery/list_under_replicated_ledger"
    assert http.ok(f"{base}?printmissingreplica=true&missingreplica=127.0.0.1:1") == {}
    assert http.ok("/api/v1/autorecovery/jobs") == []


def _requested_audits(http: Http) -> float:
    """bkaio_autorecovery_audits_total{reason="requested"} of the bookie `http` talks to."""
    with urllib.request.urlopen(http.base + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "bkaio_autorecovery_audits_total"
        and sample.labels.get("reason") == "requested"
    )


def test_trigger_audit_on_a_bookie_that_is_not_the_auditor(cluster: Standalone, http: Http) -> None:
    # It answered {"triggered": false} and asked nobody; now it asks the elected auditor
    # through the metadata, as `bkaio shell triggeraudit` does, and that one audits.
    deadline = time.monotonic() + 60
    while (auditor := http.ok("/api/v1/autorecovery/who_is_auditor")["auditor"]) is None:
        assert time.monotonic() < deadline, "no auditor elected"
        time.sleep(0.1)
    ids = [cluster.bookie_id(i) for i in range(3)]
    other = Http(cluster, next(i for i, bookie_id in enumerate(ids) if bookie_id != auditor))
    at_auditor = Http(cluster, ids.index(auditor))
    before = _requested_audits(at_auditor)
    answer = other.ok("/api/v1/autorecovery/trigger_audit", method="PUT", authorized=True)
    assert answer == {"requested": True, "auditor": auditor}
    while _requested_audits(at_auditor) <= before:
        assert time.monotonic() < deadline, "the auditor did not audit"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/bookie/list_bookies?type=all", None),
        ("GET", "/api/v1/bookie/list_bookies?print_hostnames=maybe", None),
        ("GET", "/api/v1/bookie/list_disk_file?file_type=logs", None),
        ("GET", "/api/v1/ledger/list?print_metadata=yes", None),
        ("GET", "/api/v1/ledger/list?page=0", None),
        ("GET", "/api/v1/ledger/metadata", None),
        ("GET", "/api/v1/ledger/metadata?ledger_id=-1", None),
        ("GET", "/api/v1/ledger/metadata?ledger_id=1.5", None),
        ("GET", f"/api/v1/ledger/metadata?ledger_id={2**63}", None),
        ("GET", "/api/v1/ledger/read", None),
        ("GET", "/api/v1/ledger/read?ledger_id=abc", None),
        ("GET", "/api/v1/ledger/read?ledger_id=1&start_entry_id=5&end_entry_id=2", None),
        ("GET", "/api/v1/ledger/read?ledger_id=1&start_entry_id=-3", None),
        ("GET", "/api/v1/autorecovery/jobs?id=x", None),
        ("PUT", "/api/v1/bookie/state", {"read_only": "yes"}),
        ("PUT", "/api/v1/bookie/state", [1, 2]),
        ("PUT", "/api/v1/bookie/state/readonly", {"read_only": True}),
        ("PUT", "/api/v1/autorecovery/status?enabled=maybe", None),
        ("PUT", "/api/v1/autorecovery/bookie", {"bookie_src": 5}),
        ("PUT", "/api/v1/autorecovery/decommission", None),
        ("GET", "/api/v1/autorecovery/ledger_key?ledger_id=x", None),
        ("DELETE", "/api/v1/ledger/delete?ledger_id=x", None),
    ],
)
def test_bad_parameters_get_a_json_400(http: Http, method: str, path: str, body: Any) -> None:
    status, answer = http.call(path, method, body, authorized=True)
    assert status == 400, (status, answer)
    assert isinstance(answer, dict) and answer["error"] and answer["kind"] == "BadRequest"


def test_missing_things_get_a_json_404(http: Http) -> None:
    for path in (
        "/api/v1/ledger/metadata?ledger_id=987654321",
        "/api/v1/ledger/read?ledger_id=987654321",
        "/api/v1/autorecovery/jobs?id=12345",
    ):
        status, answer = http.call(path)
        assert status == 404 and answer["error"], (path, status, answer)
    status, answer = http.call(
        "/api/v1/ledger/delete?ledger_id=987654321", "DELETE", authorized=True
    )
    assert status == 404 and answer["kind"] == "NoSuchLedgerError"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/api/v1/bookie/state", {"read_only": True}),
        ("PUT", "/api/v1/bookie/state/readonly", {"readOnly": True}),
        ("PUT", "/api/v1/bookie/gc", None),
        ("DELETE", "/api/v1/ledger/delete?ledger_id=1", None),
        ("PUT", "/api/v1/autorecovery/status?enabled=false", None),
        ("PUT", "/api/v1/autorecovery/trigger_audit", None),
        ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay", {"delay_seconds": 5}),
        ("PUT", "/api/v1/autorecovery/bookie", {"bookie_src": "127.0.0.1:1"}),
        ("PUT", "/api/v1/autorecovery/decommission", {"bookie_src": "127.0.0.1:1"}),
        ("GET", "/api/v1/autorecovery/ledger_key?ledger_id=1", None),
    ],
)
def test_modifying_endpoints_need_the_token(http: Http, method: str, path: str, body: Any) -> None:
    status, answer = http.call(path, method, body)
    assert status == 401 and answer["kind"] == "Unauthorized"
    status, answer = http.call(path, method, body, token="not-the-token")
    assert status == 403 and answer["kind"] == "Forbidden"


def test_lost_bookie_recovery_delay_read_set_and_reset(http: Http) -> None:
    path = "/api/v1/autorecovery/lost_bookie_recovery_delay"
    before = http.ok(path)
    assert before["source"] == "config" and before["delay_seconds"] >= 0
    assert http.ok(path, method="PUT", body={"delay_seconds": 600}, authorized=True) == {
        "delay_seconds": 600,
        "source": "metadata",
    }
    assert http.ok(path) == {"delay_seconds": 600, "source": "metadata"}
    for bad in ({}, {"delay_seconds": "soon"}, {"delay_seconds": True}, {"delay_seconds": -1}):
        status, answer = http.call(path, "PUT", bad, authorized=True)
        assert status == 400 and "error" in answer, (bad, answer)
    assert http.ok(path) == {
        "delay_seconds": 600,
        "source": "metadata",
    }  # Bad input changed nothing.
    assert http.ok(path, method="PUT", body={"delay_seconds": None}, authorized=True) == before


def test_delete_and_gc_with_the_token(cluster: Standalone, http: Http) -> None:
    doomed = write_test_ledger(cluster.uri)
    deleted = http.ok(f"/api/v1/ledger/delete?ledger_id={doomed}", method="DELETE", authorized=True)
    assert deleted == {"deleted": doomed}
    status, _ = http.call(f"/api/v1/ledger/metadata?ledger_id={doomed}")
    assert status == 404
    gc = http.ok("/api/v1/bookie/gc", method="PUT", authorized=True)
    assert gc["shards"][0]["shard_index"] == 0
    (details,) = http.ok("/api/v1/bookie/gc_details")
    assert details["gc_runs"] >= 1 and details["last_gc_ms"] > 0
