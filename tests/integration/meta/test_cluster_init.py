"""Only an initialised store holds a cluster: clients, the shell and bookies refuse any other.

Real etcd (a fresh prefix nobody wrote to) and real SQLite files; the shell and the bookie
through their real entry points.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bkaio.errors import ConfigError, MetadataError
from bkaio.ledger_client import BookKeeper
from bkaio.meta import (
    ClusterExistsError,
    ClusterNotInitialisedError,
    initialise_cluster,
    initialise_cluster_at,
    open_metadata,
    open_store,
    read_instance_id,
)
from bkaio.testing.procs import LOOPBACK, free_port
from tests.fixtures.bookies import BookieCluster
from tests.fixtures.etcd import EtcdServer

BKAIO = str(Path(sys.executable).parent / "bkaio")


@pytest.fixture(params=["etcd", "sqlite"])
def bare_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A metadata URI that names no cluster: a fresh etcd prefix, an SQLite file not created."""
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("bare_etcd_server")
        return server.uri
    return f"sqlite://{tmp_path / 'typo' / 'meta.db'}"


async def test_a_store_without_a_cluster_is_refused_and_left_untouched(bare_uri: str) -> None:
    with pytest.raises(ClusterNotInitialisedError, match="initnewcluster") as refused:
        await open_metadata(bare_uri)
    assert bare_uri.partition("?")[0] in str(refused.value)
    with pytest.raises(ClusterNotInitialisedError):
        await BookKeeper.connect(bare_uri)
    if bare_uri.startswith("sqlite"):
        assert not Path(bare_uri.removeprefix("sqlite://")).parent.exists()
    else:
        store = await open_store(bare_uri)
        try:
            assert await store.list_prefix("/") == []  # Nothing was written.
        finally:
            await store.close()


async def test_initialise_once_then_open(bare_uri: str) -> None:
    instance_id = await initialise_cluster_at(bare_uri)
    async with await open_metadata(bare_uri) as meta:
        assert meta.instance_id == instance_id
        with pytest.raises(ClusterExistsError, match=instance_id):
            await initialise_cluster(meta.store)
        assert await initialise_cluster(meta.store, exist_ok=True) == instance_id
        layout = await meta.store.get("/layout")
        assert layout is not None and layout.value == b"1"


async def test_concurrent_initialisers_agree_on_one_instance_id(bare_uri: str) -> None:
    ids = await asyncio.gather(*(initialise_cluster_at(bare_uri, exist_ok=True) for _ in range(6)))
    assert len(set(ids)) == 1
    store = await open_store(bare_uri)
    try:
        assert await read_instance_id(store) == ids[0]
    finally:
        await store.close()


async def test_a_half_initialised_store_is_not_a_cluster(bare_uri: str) -> None:
    """A crash between the two writes leaves an instance id without a layout: still refused,
    and the next initialise_cluster finishes it with that id."""
    store = await open_store(bare_uri)
    try:
        await store.put("/instanceid", b"abc123")
        with pytest.raises(ClusterNotInitialisedError):
            await open_metadata(bare_uri)
        assert await initialise_cluster(store) == "abc123"
    finally:
        await store.close()
    async with await open_metadata(bare_uri) as meta:
        assert meta.instance_id == "abc123"


async def test_an_unknown_layout_is_refused(bare_uri: str) -> None:
    store = await open_store(bare_uri)
    try:
        await store.put("/layout", b"9")
        await store.put("/instanceid", b"abc")
    finally:
        await store.close()
    with pytest.raises(ConfigError, match="layout version"):
        await open_metadata(bare_uri)


def test_the_shell_refuses_a_mistyped_sqlite_path(tmp_path: Path) -> None:
    typo = tmp_path / "metta.db"
    done = subprocess.run(
        [BKAIO, "shell", "listledgers", "--metadata", f"sqlite://{typo}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "no bkaio cluster" in done.stderr and "initnewcluster" in done.stderr
    assert not typo.exists()


async def test_a_bookie_refuses_a_store_without_a_cluster(
    bare_etcd_server: EtcdServer, tmp_path: Path
) -> None:
    cluster = BookieCluster(bare_etcd_server.uri, tmp_path, count=1)
    bookie = cluster.spawn(0)  # Not `async with`: that would initialise the cluster.
    try:
        assert bookie.process is not None
        code = await asyncio.to_thread(bookie.process.wait, 60)
        assert code != 0
        assert "no bkaio cluster" in bookie.log_tail() and "initnewcluster" in bookie.log_tail()
    finally:
        await cluster.close()


async def test_unreachable_etcd_is_reported_with_the_connect_timeout() -> None:
    """The first contact gives up after the connect timeout (5 s by default, not the 30 s an
    operation rides out), and says which; a silent host is cut off the same way."""
    refusing = f"etcd://{LOOPBACK}:{free_port()}/bkaio"
    with pytest.raises(MetadataError, match=r"unreachable for 5\.0 s"):
        await open_metadata(refusing)
    with pytest.raises(MetadataError, match=r"unreachable for 0\.3 s"):
        await BookKeeper.connect(refusing, metadata_timeout=0.3)
    with pytest.raises(MetadataError, match=r"unreachable for 0\.2 s"):
        await open_metadata(refusing + "?connect_timeout=0.2")
    # A host that accepts TCP but never speaks gRPC: the attempt itself is cut off.
    with socket.socket() as silent:  # The kernel completes handshakes; nobody answers.
        silent.bind((LOOPBACK, 0))
        silent.listen()
        port = silent.getsockname()[1]
        with pytest.raises(MetadataError, match=r"0\.3 s"):
            await open_metadata(f"etcd://{LOOPBACK}:{port}/bkaio", connect_timeout_seconds=0.3)


def test_the_cli_timeout_option_bounds_the_first_contact() -> None:
    uri = f"etcd://{LOOPBACK}:{free_port()}/bkaio"
    done = subprocess.run(
        [BKAIO, "shell", "listledgers", "--metadata", uri, "--timeout", "0.4"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "unreachable for 0.4 s" in done.stderr and done.stderr.count("\n") == 1
