"""`bkaio shell` autorecovery commands through the real `bkaio` entry point, against real bookie
processes and etcd: recover and decommission do the safe thing (defect 4), and the operator
controls are commands (defect 5)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from bkaio.autorecovery import list_under_replicated, who_is_auditor
from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.quorum import write_set
from bkaio.meta import LedgerState
from tests.fixtures.bookies import BookieClusterFactory
from tests.fixtures.etcd import EtcdServer

from .helpers import (
    AUTORECOVERY_CONFIG,
    PASSWORD,
    bkaio_cli,
    ledgers_naming,
    verify_full_replication,
    wait_for,
    write_ledgers,
)

# The bookies run no autorecovery: only the commands act.
QUIET: dict[str, dict[str, Any]] = {**AUTORECOVERY_CONFIG, "autorecovery": {"enabled": False}}


async def test_recover_refuses_live_and_unknown_bookies_and_plans_without_acting(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    uri = etcd_server.uri
    cluster = await bookie_cluster_factory(count=4, metadata_uri=uri, config=QUIET)
    meta = await cluster.metadata()
    closed = await write_ledgers(uri, 3, 40, 64)
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:
        writer = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        await asyncio.gather(*(writer.append(b"open-%d" % i) for i in range(20)))
        target = writer.metadata.ensembles[0][1][0]
        named = sorted(md.ledger_id for md in await _naming(meta, target))
        token = ("--admin-token", cluster.admin_token, "--metadata", uri)

        refused = await bkaio_cli("shell", "recover", target, *token)
        assert refused.returncode == 1, refused
        assert "--force" in refused.stderr and target in refused.stderr
        assert "Traceback" not in refused.stderr
        assert (await meta.ledgers.get(writer.ledger_id)).state is LedgerState.OPEN
        assert await list_under_replicated(meta) == []

        for command in ("recover", "decommission"):
            unknown = await bkaio_cli("shell", command, "127.0.0.1:1", *token)
            assert unknown.returncode == 1, unknown
            assert "127.0.0.1:1" in unknown.stderr and "unknown" in unknown.stderr
            assert "Traceback" not in unknown.stderr

        query = await bkaio_cli("shell", "recover", target, "--query", "--json", *token)
        assert query.returncode == 0, query.stderr
        listed = json.loads(query.stdout)
        assert sorted(ledger["ledger_id"] for ledger in listed["ledgers"]) == named
        assert listed["registered"] is True

        dry = await bkaio_cli("shell", "recover", target, "--dry-run", "--json", *token)
        assert dry.returncode == 0, dry.stderr
        plan = {ledger["ledger_id"]: ledger for ledger in json.loads(dry.stdout)["ledgers"]}
        assert plan[writer.ledger_id]["would_fence"] is True
        for ledger_id in set(named) - {writer.ledger_id}:
            assert plan[ledger_id]["entries"] == 40 and not plan[ledger_id]["would_fence"]
            (fragment,) = plan[ledger_id]["fragments"]
            assert fragment["replacement"] not in (None, target)
        human = await bkaio_cli("shell", "recover", target, "--dry-run", *token)
        assert "fence, close, copy" in human.stdout and "needs --force" in human.stdout

        # Nothing of the above changed anything.
        assert (await meta.ledgers.get(writer.ledger_id)).state is LedgerState.OPEN
        assert sorted(md.ledger_id for md in await _naming(meta, target)) == named
        assert await list_under_replicated(meta) == []

        victim = cluster.bookie_ids.index(target)
        cluster.kill9(victim)
        await cluster.wait_until_deregistered(victim)
        skipped = await bkaio_cli(
            "shell", "recover", target, "--skip-open-ledgers", "--json", *token
        )
        assert skipped.returncode == 1, skipped  # Not complete: the open ledger was left.
        report = json.loads(skipped.stdout)
        assert report["skipped_open"] == [writer.ledger_id]
        assert "ledgers" in skipped.stderr and "entries" in skipped.stderr  # Progress lines.
        assert (await meta.ledgers.get(writer.ledger_id)).state is LedgerState.OPEN
        assert [md.ledger_id for md in await _naming(meta, target)] == [writer.ledger_id]

        done = await bkaio_cli(
            "shell", "recover", target, "--recover-timeout", "120", "--json", *token
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["complete"] and report["open_ledgers_recovered"] == 1
    assert await _naming(meta, target) == []
    for ledger_id, payloads in closed.items():
        await verify_full_replication(cluster, await meta.ledgers.get(ledger_id), payloads)


async def test_recover_reports_an_unreadable_ledger_at_once_and_goes_on(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Ledger U (E3 Qw2) and R (E3 Qw3) on b0, b1, b2; b0 and b1 die: U's entry 0 has no copy
    left. `recover b0` moves R, prints one line for U, and exits 1 without a traceback."""
    uri = etcd_server.uri
    cluster = await bookie_cluster_factory(count=5, metadata_uri=uri, config=QUIET)
    meta = await cluster.metadata()
    await asyncio.gather(cluster.stop(3), cluster.stop(4))
    for index in (3, 4):
        await cluster.wait_until_deregistered(index)
    payloads = [b"entry-%d" % i for i in range(30)]
    async with BookKeeper.connect(uri, add_timeout=30.0) as bk:
        striped = await bk.create_ledger(3, 2, 2, password=PASSWORD)
        full = await bk.create_ledger(3, 3, 2, password=PASSWORD)
        for handle in (striped, full):
            await asyncio.gather(*(handle.append(p) for p in payloads))
            await handle.close()
    await asyncio.gather(cluster.start(3), cluster.start(4))
    b0 = cluster.bookie_ids[0]
    cluster.kill9(0)
    cluster.kill9(1)
    await cluster.wait_until_deregistered(0)
    await cluster.wait_until_deregistered(1)
    result = await bkaio_cli(
        "shell", "recover", b0, "--json", "--admin-token", cluster.admin_token, "--metadata", uri
    )
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    failure_lines = [line for line in result.stderr.splitlines() if line.startswith("FAILED")]
    assert len(failure_lines) == 1, result.stderr
    report = json.loads(result.stdout)
    entry_id = report["unreadable"][str(striped.ledger_id)]
    assert f"ledger {striped.ledger_id} entry {entry_id}:" in failure_lines[0]
    ensemble = (await meta.ledgers.get(striped.ledger_id)).ensembles[0][1]
    copies = {ensemble[i] for i in write_set(entry_id, 3, 2)}
    assert copies == {b0, cluster.bookie_ids[1]}  # Both copies were on the dead bookies.
    assert list(report["failed"]) == [str(striped.ledger_id)]
    md = await meta.ledgers.get(full.ledger_id)
    assert all(b0 not in ensemble for _, ensemble in md.ensembles)  # R went on and moved.
    assert f"not re-replicated: {striped.ledger_id};" in result.stderr.splitlines()[-1]


async def test_decommissioned_bookie_stays_read_only_until_recommissioned(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    uri = etcd_server.uri
    cluster = await bookie_cluster_factory(count=4, metadata_uri=uri, config=QUIET)
    meta = await cluster.metadata()
    written = await write_ledgers(uri, 4, 30, 64)
    target = cluster.bookie_ids[3]
    common = ("--admin-token", cluster.admin_token, "--metadata", uri)
    result = await bkaio_cli("shell", "decommission", target, "--json", *common)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["complete"]
    assert await _naming(meta, target) == []
    assert (await cluster.registered())[target].read_only
    await cluster.restart(3)
    await cluster.wait_until_registered(3)
    await asyncio.sleep(1.0)  # Long enough for a wrongly writable bookie to register so.
    assert (await cluster.registered())[target].read_only
    status = await bkaio_cli("shell", "autorecovery", "--status", "--json", "--metadata", uri)
    assert json.loads(status.stdout)["decommissioned_bookies"] == [target]
    again = await bkaio_cli("shell", "recommission", target, "--json", "--metadata", uri)
    assert again.returncode == 0 and json.loads(again.stdout)["was_decommissioned"]
    await cluster.wait_until_registered(3, read_only=False, timeout_seconds=30)
    for ledger_id, payloads in written.items():
        await verify_full_replication(cluster, await meta.ledgers.get(ledger_id), payloads)


async def test_operator_controls_delay_switch_audit_and_listing(
    bookie_cluster_factory: BookieClusterFactory, etcd_server: EtcdServer
) -> None:
    """Three bookies with autorecovery and E3 ledgers (so marks stay: no replacement exists):
    the delay set by command wins over the config's 0 s; a disabled switch stops audits; an
    audit request marks at once; the listing shows missing bookies and ages."""
    uri = etcd_server.uri
    cluster = await bookie_cluster_factory(count=3, metadata_uri=uri, config=AUTORECOVERY_CONFIG)
    meta = await cluster.metadata()
    written = await write_ledgers(uri, 3, 20, 64)
    base = ("--metadata", uri)

    async def cli_json(*args: str) -> Any:
        result = await bkaio_cli("shell", *args, "--json", *base)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    assert await cli_json("lostbookierecoverydelay", "--get") == {
        "seconds": 30.0,
        "source": "config",
    }
    assert (await cli_json("lostbookierecoverydelay", "--set", "3600"))["seconds"] == 3600.0
    assert await cli_json("lostbookierecoverydelay", "--get") == {
        "seconds": 3600.0,
        "source": "metadata",
    }
    # Bad values and conflicting switches: tests/unit/cli/test_arguments.py (in process).

    await cluster.stop(2)
    lost = cluster.bookie_ids[2]
    await asyncio.sleep(2.0)
    assert await list_under_replicated(meta) == []  # The metadata's delay (1 h) holds.

    assert (await cli_json("autorecovery", "--disable"))["enabled"] is False
    requested = await cli_json("triggeraudit")
    assert requested["requested"] is True and requested["auditor"] in cluster.bookie_ids[:2]
    await asyncio.sleep(2.0)
    assert await list_under_replicated(meta) == []  # Disabled: no audit.

    status = await cli_json("autorecovery", "--enable")
    assert status["enabled"] is True and status["lost_bookie_delay_seconds"] == 3600.0
    await cli_json("triggeraudit")

    async def all_marked() -> bool:
        return len(await list_under_replicated(meta)) == len(written)

    await wait_for(all_marked, 30, "an audit request marks without the delay")
    rows = await cli_json("listunderreplicated")
    assert sorted(row["ledger_id"] for row in rows) == sorted(written)
    assert all(row["missing_bookies"] == [lost] and row["age_seconds"] >= 0 for row in rows)
    human = await bkaio_cli("shell", "listunderreplicated", *base)
    assert "AGE" in human.stdout and lost in human.stdout
    auditor = await cli_json("whoisauditor")
    assert auditor["auditor"] == await who_is_auditor(meta)
    assert (await cli_json("autorecovery", "--status"))["under_replicated_ledgers"] == 3
    assert (await cli_json("lostbookierecoverydelay", "--reset"))["source"] == "config"


async def _naming(meta: Any, bookie_id: str) -> list[Any]:
    return [await meta.ledgers.get(i) for i in await ledgers_naming(meta, bookie_id)]
