"""`bkaio shell` commands on the cluster as a whole (BookKeeper's names).

    initnewcluster      create the cluster in empty metadata (refuses an existing one)
    metaformat          wipe the metadata and create a new cluster (--force to wipe one)
    nukeexistingcluster delete the cluster's metadata (--instance-id ID, or --force)
    clusterinfo         instance id, bookies by state, ledgers, under-replication, auditor

All of them go through bkaio/meta/cluster.py (a cluster's identity, and the one function that
creates one) and bkaio/meta/cluster_admin.py (nuke, format, describe).
"""

from __future__ import annotations

from typing import Any

import click

from bkaio.cli.common import json_option, metadata_option, run
from bkaio.cli.output import emit
from bkaio.cli.params import INSTANCE_ID


async def _with_store(uri: str, work: Any, *, create: bool = True) -> Any:
    """`work(store)` on the store at `uri` (`create`: a new SQLite file if there is none)."""
    from bkaio.meta import open_store

    store = await open_store(uri, create=create)
    try:
        return await work(store)
    finally:
        await store.close()


@click.command("initnewcluster")
@click.option(
    "--instance-id",
    default=None,
    type=INSTANCE_ID,
    help="The new cluster's instance id: letters, digits, '-', '_', '.' (default: a random one).",
)
@metadata_option
@json_option
def init_new_cluster(instance_id: str | None, metadata_uri: str, as_json: bool) -> None:
    """Create a new cluster in metadata that holds none (refuses an existing cluster)."""
    from bkaio.meta.cluster import initialise_cluster

    async def work(store: Any) -> Any:
        return await initialise_cluster(store, instance_id=instance_id)

    created = run(_with_store(metadata_uri, work))
    result = {"instance_id": created, "metadata": metadata_uri, "created": True}
    emit(result, as_json=as_json, human=f"created cluster {created}")


@click.command("metaformat")
@click.option(
    "--force", is_flag=True, help="Wipe the cluster that is there (every ledger in it) first."
)
@metadata_option
@json_option
def meta_format(force: bool, metadata_uri: str, as_json: bool) -> None:
    """Format the metadata: a new, empty cluster (with --force, over an existing one).

    Refused while any bookie is registered. The bookies' directories are not touched: format
    them with `bkaio bookie format --force` before they join the new cluster.
    """
    from bkaio.meta.cluster_admin import format_cluster

    async def work(store: Any) -> Any:
        return await format_cluster(store, force=force)

    created = run(_with_store(metadata_uri, work))
    result = {"instance_id": created, "metadata": metadata_uri, "formatted": True}
    emit(result, as_json=as_json, human=f"formatted: new cluster {created}")


@click.command("nukeexistingcluster")
@click.option(
    "--instance-id",
    default=None,
    help="The cluster's instance id, as confirmation (`bkaio shell clusterinfo` shows it).",
)
@click.option("--force", is_flag=True, help="Nuke without checking the instance id.")
@metadata_option
@json_option
def nuke_existing_cluster(
    instance_id: str | None, force: bool, metadata_uri: str, as_json: bool
) -> None:
    """Delete every key of the cluster: ledgers, cookies, marks and its identity.

    Needs --instance-id (the cluster's) or --force; refused while any bookie is registered.
    """
    if instance_id is None and not force:
        raise click.UsageError("nukeexistingcluster needs --instance-id ID (or --force)")
    from bkaio.meta.cluster_admin import nuke_cluster

    async def work(store: Any) -> Any:
        return await nuke_cluster(store, instance_id=instance_id, force=force)

    report = run(_with_store(metadata_uri, work, create=False))
    result = {"instance_id": report.instance_id, "keys_deleted": report.keys_deleted}
    emit(
        result,
        as_json=as_json,
        human=f"nuked cluster {report.instance_id or '(none)'}: {report.keys_deleted} keys",
    )


@click.command("clusterinfo")
@metadata_option
@json_option
def cluster_info(metadata_uri: str, as_json: bool) -> None:
    """Instance id, bookies (writable, read-only, unavailable, decommissioned), ledgers,
    under-replicated ledgers (and undecodable marks), autorecovery and the auditor."""
    from bkaio.meta import open_metadata
    from bkaio.meta.cluster_admin import describe_cluster

    async def go() -> dict[str, Any]:
        metadata = await open_metadata(metadata_uri)
        try:
            return (await describe_cluster(metadata)).to_dict()
        finally:
            await metadata.close()

    info = run(go())
    lines = [
        f"instance id          {info['instance_id']}",
        f"writable bookies     {_ids(info['writable_bookies'])}",
        f"read-only bookies    {_ids(info['read_only_bookies'])}",
        f"unavailable bookies  {_ids(info['unavailable_bookies'])}",
        f"decommissioned       {_ids(info['decommissioned_bookies'])}",
        f"ledgers              {info['ledgers']}",
        f"under-replicated     {info['under_replicated_ledgers']}",
        f"undecodable marks    {_bad_records(info['bad_underreplicated_records'])}",
        f"autorecovery         {'enabled' if info['autorecovery_enabled'] else 'disabled'}",
        f"auditor              {info['auditor'] or 'none elected'}",
    ]
    emit(info, as_json=as_json, human="\n".join(lines))


def _bad_records(count: int) -> str:
    if not count:
        return "0"
    return f"{count} (skipped by autorecovery; `bkaio shell listunderreplicated` names them)"


def _ids(bookies: list[str]) -> str:
    return f"{len(bookies)}: {', '.join(bookies)}" if bookies else "0"


COMMANDS = (init_new_cluster, meta_format, nuke_existing_cluster, cluster_info)
