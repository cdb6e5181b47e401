"""Hostile clients against a live bookie (faults.md B3): every row of the table, plus random frames.

One bookie process (two shards, tight limits, an auth token, ledger keys checked against
metadata) serves the whole module. Each case runs while a canary client adds and reads on its
own connection; afterwards the bookie's processes are the same, the canary saw no error, the
workers' descriptor count is back to its baseline and their RSS stays under a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bkaio.ledger_client.bookkeeper import password_hash
from bkaio.meta import open_metadata
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.digest import entry_digest, master_key
from bkaio.protocol.messages import (
    PROTOCOL_VERSION,
    AddEntryRequest,
    ErrorResponse,
    Flag,
    HelloRequest,
    Op,
    PingRequest,
    ReadEntryRequest,
    ReadEntryResponse,
    ReadLacRequest,
    ReadRangeRequest,
    ReadRangeResponse,
    Response,
)
from bkaio.protocol.status import Status
from tests.fixtures.bookies import BookieCluster, _http_ok
from tests.fixtures.etcd import initialise_cluster_blocking
from tests.integration.bookie.raw_client import RawClient

TOKEN = "hostile-suite-token"
ADMIN_TOKEN = "hostile-admin-token"
PASSWORD = b"canary"
MAX_FRAME_BYTES = 1024 * 1024
MAX_ENTRY_BYTES = 64 * 1024
RSS_BOUND_BYTES = 400 * 1024 * 1024
CONFIG: dict[str, dict[str, Any]] = {
    "server": {
        "auth_token": TOKEN,
        "hello_timeout_seconds": 1.0,
        "frame_read_timeout_seconds": 1.0,
        "idle_timeout_seconds": 3.0,
        "max_connections": 48,
        "max_inflight_per_connection": 256,
        "write_buffer_high_bytes": 256 * 1024,
        "max_frame_bytes": MAX_FRAME_BYTES,
        "max_memory_bytes": 32 * MAX_FRAME_BYTES,
        "max_entry_bytes": MAX_ENTRY_BYTES,
        "max_read_range_count": 100,
        "max_read_range_bytes": 64 * 1024,
        "max_long_poll_waiters": 16,
        "auth_failure_delay_seconds": 0.02,
        "auth_failure_max_delay_seconds": 0.1,
        "drain_timeout_seconds": 2.0,
    },
}


# --- the bookie, once per module ------------------------------------------------------------


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieCluster]:
    base = tmp_path_factory.mktemp("hostile")
    cluster = BookieCluster(
        f"sqlite://{base / 'meta.db'}",
        base,
        count=1,
        shards=2,
        config=CONFIG,
        admin_token=ADMIN_TOKEN,
    )
    initialise_cluster_blocking(cluster.metadata_uri)
    process = cluster.spawn(0)
    try:
        deadline = time.monotonic() + 60
        while not _http_ok(process.admin_url + "/api/v1/bookie/is_ready"):
            if not process.running:
                raise RuntimeError(f"bookie exited:\n{process.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"bookie not ready:\n{process.log_tail()}")
            time.sleep(0.05)
        yield cluster
    finally:
        if process.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):  # Killed below.
                process.process.wait(20)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.process.wait()


def _workers(parent_pid: int) -> list[int]:
    children = Path(f"/proc/{parent_pid}/task/{parent_pid}/children").read_text().split()
    return sorted(int(pid) for pid in children)


def _fd_count(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _metric(cluster: BookieCluster, series: str) -> float:
    url = f"{cluster[0].admin_url}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _limit(cluster: BookieCluster, name: str) -> float:
    return _metric(cluster, f'bkaio_bookie_limit_hits_total{{limit="{name}"}}')


# --- clients ----------------------------------------------------------------------------------


def _frame(body: Any) -> bytes:
    packed: bytes = msgpack.packb(body)
    return struct.pack(">I", len(packed)) + packed


async def _connect(
    cluster: BookieCluster, *, hello: bool = True, token: str | None = TOKEN, shard: int = 0
) -> RawClient:
    reader, writer = await asyncio.open_connection(
        cluster[0].host, cluster[0].shard_port(shard), limit=1 << 24
    )
    client = RawClient(reader, writer)
    if hello:
        response = await client.request(
            HelloRequest(client.next_id(), PROTOCOL_VERSION, "hostile", token)
        )
        assert response.status is Status.OK, response
    return client


async def _new_ledger(cluster: BookieCluster, shard: int = 0) -> tuple[int, bytes]:
    """A ledger with metadata (so its key is accepted) on `shard`; its id and master key."""
    meta = await open_metadata(cluster.metadata_uri)
    try:
        while (ledger_id := await meta.ledgers.next_id()) % 2 != shard:
            pass
        await meta.ledgers.create(
            LedgerMetadata(
                ledger_id=ledger_id,
                ensemble_size=1,
                write_quorum=1,
                ack_quorum=1,
                ensembles=((0, (cluster[0].bookie_id,)),),
                password_hash=password_hash(PASSWORD, ledger_id),
            )
        )
    finally:
        await meta.close()
    return ledger_id, master_key(PASSWORD, ledger_id)


def _add(
    request_id: int, ledger_id: int, entry_id: int, payload: bytes, key: bytes, **kw: Any
) -> AddEntryRequest:
    lac = entry_id - 1
    length = len(payload) * (entry_id + 1)
    digest = kw.pop("digest", None)
    if digest is None:
        digest = entry_digest(ledger_id, entry_id, lac, length, payload)
    flags = kw.pop("flags", Flag.NONE)
    return AddEntryRequest(
        request_id, ledger_id, entry_id, flags, key, lac, length, digest, payload
    )


def canary_payload(entry_id: int) -> bytes:
    return f"canary-{entry_id}".encode()


@dataclass
class Canary:
    """Adds and reads back on its own connection until stopped; remembers anything wrong.

    It runs on a thread of its own, with its own event loop (`start`): the test's loop does not
    run between Hypothesis examples (pytest-asyncio runs each one to completion), and a canary
    on it fell silent for as long as such a gap lasted; past the bookie's idle timeout (3 s
    here) the bookie closed its connection, so a loaded machine failed a case that did no harm
    (test_random_frames_never_hurt_the_bookie, in a run of the fault suite beside a CPU hog).
    """

    cluster: BookieCluster
    ledger_id: int
    key: bytes
    written: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)  # First add and read done.
    stopped: threading.Event = field(default_factory=threading.Event)  # No more requests.
    # The guard counts the workers' descriptors with the canary's connection still open.
    release: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self.thread.start()

    async def _main(self) -> None:
        client: RawClient | None = None
        try:
            client = await _connect(self.cluster)
            await self.run(client)
        except (OSError, TimeoutError, ConnectionError) as error:
            self.errors.append(f"canary connection failed: {error!r}")
        finally:
            self.stopped.set()
            await asyncio.to_thread(self.release.wait)
            if client is not None:
                await client.close()

    async def run(self, client: RawClient) -> None:
        while not self.stop.is_set():
            entry_id = self.written
            add = _add(
                client.next_id(), self.ledger_id, entry_id, canary_payload(entry_id), self.key
            )
            response = await client.request(add, timeout_seconds=10)
            if response.status is not Status.OK:
                self.errors.append(f"add {entry_id}: {response}")
                return
            self.written += 1
            read = ReadEntryRequest(client.next_id(), self.ledger_id, entry_id, Flag.NONE, None)
            got = await client.request(read, timeout_seconds=10)
            if not (
                isinstance(got, ReadEntryResponse)
                and got.status is Status.OK
                and got.entry is not None
                and got.entry.payload == canary_payload(entry_id)
            ):
                self.errors.append(f"read {entry_id}: {got}")
                return
            self.started.set()
            await asyncio.sleep(0.005)


@dataclass
class Guard:
    cluster: BookieCluster
    canary: Canary


@pytest.fixture
async def guard(bookie: BookieCluster) -> AsyncIterator[Guard]:
    parent = bookie[0].pid
    workers = _workers(parent)
    assert len(workers) == 2, workers
    ledger_id, key = await _new_ledger(bookie)
    canary = Canary(bookie, ledger_id, key)
    canary.start()
    assert canary.thread is not None
    try:
        # After the first add: a shard opens its metadata handle (key checks) once, on first use.
        assert await asyncio.to_thread(canary.started.wait, 10), canary.errors
        baseline_fds = _fd_count(workers)
        yield Guard(bookie, canary)
        await asyncio.sleep(0.05)  # Let the canary go on past the case's last request.
        canary.stop.set()
        await asyncio.to_thread(canary.stopped.wait)
        assert canary.errors == [], canary.errors
        assert canary.written > 0
        assert bookie[0].running and bookie[0].pid == parent
        assert _workers(parent) == workers, "a shard worker restarted"
        deadline = time.monotonic() + 15
        while (fds := _fd_count(workers)) > baseline_fds:
            assert time.monotonic() < deadline, f"descriptors leaked: {fds} > {baseline_fds}"
            await asyncio.sleep(0.1)
        for pid in workers:
            assert _rss_bytes(pid) < RSS_BOUND_BYTES
    finally:
        canary.stop.set()
        canary.release.set()
        await asyncio.to_thread(canary.thread.join)


async def _error_then_closed(client: RawClient, *, request_id: int = 0) -> ErrorResponse:
    response = await client.read_response()
    assert isinstance(response, ErrorResponse), response
    assert response.status is Status.BAD_REQUEST and response.request_id == request_id
    assert await client.closed_by_peer()
    await client.close()
    return response


async def _read_status(client: RawClient, ledger_id: int, entry_id: int) -> Status:
    response = await client.request(
        ReadEntryRequest(client.next_id(), ledger_id, entry_id, Flag.NONE, None)
    )
    return response.status


# --- the B3 table -----------------------------------------------------------------------------


async def test_the_canary_outlasts_a_stalled_test_loop(guard: Guard) -> None:
    """The test's loop does not run for longer than the bookie's idle timeout, as between two
    Hypothesis examples on a loaded machine: the canary, on its own loop, keeps its connection
    busy (the guard fails the case if the bookie closed it)."""
    idle_timeout = float(CONFIG["server"]["idle_timeout_seconds"])
    time.sleep(idle_timeout + 0.5)  # noqa: ASYNC251 - blocking the loop is the case.


async def test_frame_cut_short_then_eof_applies_nothing(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    canary = guard.canary
    frame = _frame(_add(99, canary.ledger_id, 10**6, b"half", canary.key).to_body())
    client.send_raw(frame[: len(frame) // 2])
    await client.writer.drain()
    client.writer.write_eof()
    assert await client.closed_by_peer()
    await client.close()
    checker = await _connect(guard.cluster)
    assert await _read_status(checker, canary.ledger_id, 10**6) is Status.NO_SUCH_ENTRY
    await checker.close()


async def test_zero_length_prefix(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    client.send_raw(struct.pack(">I", 0))
    await _error_then_closed(client)


async def test_huge_length_prefix_is_refused_before_any_body(guard: Guard) -> None:
    before = _limit(guard.cluster, "max_frame_bytes")
    client = await _connect(guard.cluster)
    client.send_raw(struct.pack(">I", 0xFFFFFFFF))  # No body at all: the answer comes anyway.
    response = await _error_then_closed(client)
    assert "max_frame_bytes" in response.message
    assert _limit(guard.cluster, "max_frame_bytes") > before


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1\xc1\xc1",  # A reserved msgpack byte.
        b"\xdb\xff\xff\xff\xff",  # A str whose length runs past the body.
        msgpack.packb([int(Op.PING), 1]) + b"\x00",  # Trailing bytes after one object.
        msgpack.packb({"op": 10}),  # Not an array: map, int, str, nil.
        msgpack.packb(10),
        msgpack.packb("ping"),
        msgpack.packb(None),
        b"\x91" * 5000 + b"\xc0",  # 5000 nested arrays.
        b"\x81\xa1k" * 5000 + b"\xc0",  # 5000 nested maps.
        b"\xd4\x01\x00",  # An ext type.
    ],
    ids=[
        "reserved",
        "str-overrun",
        "trailing",
        "map",
        "int",
        "str",
        "nil",
        "nested-arrays",
        "nested-maps",
        "ext",
    ],
)
async def test_bodies_that_are_not_one_msgpack_array(guard: Guard, data: bytes) -> None:
    client = await _connect(guard.cluster)
    client.send_raw(struct.pack(">I", len(data)) + data)
    await _error_then_closed(client)


@pytest.mark.parametrize(
    "body",
    [
        [int(Op.READ_ENTRY), 11, 1, 0],  # Too short.
        [int(Op.PING), 12, 1],  # Too long.
        [int(Op.ADD_ENTRY), 13, "1", 0, 0, b"k" * 32, -1, 1, 0, b"x"],  # str for int.
        [int(Op.READ_ENTRY), 14, 1.5, 0, 0, None],  # float.
        [int(Op.READ_ENTRY), 15, True, 0, 0, None],  # bool.
        [int(Op.ADD_ENTRY), 16, 2, 0, 0, "k" * 32, -1, 1, 0, b"x"],  # str for bin.
        [int(Op.HELLO), 17, 1, b"client", None],  # bin for str.
        [int(Op.READ_ENTRY), 18, [2], 0, 0, None],  # Nested array.
        [int(Op.READ_ENTRY), 19, 2**64 - 1, 0, 0, None],  # Above int64.
        [int(Op.READ_ENTRY), 20, -4, 0, 0, None],  # Negative ledger id.
        [int(Op.READ_ENTRY), 21, 2, -2, 0, None],  # Negative entry id other than -1.
        [int(Op.READ_LAC), 22, 2, 4, None, -1, 2**40],  # Long-poll timeout out of range.
        [99, 23],  # Unknown op.
        [int(Op.ERROR), 24],  # A response op sent as a request.
    ],
)
async def test_malformed_requests_name_their_request_id(guard: Guard, body: list[Any]) -> None:
    client = await _connect(guard.cluster)
    client.send_raw(_frame(body))
    response = await client.read_response()
    assert response.status is Status.BAD_REQUEST and response.request_id == body[1]
    assert await client.closed_by_peer()
    await client.close()


async def test_requests_before_hello_second_hello_and_other_versions(guard: Guard) -> None:
    early = await _connect(guard.cluster, hello=False)
    assert (await early.request(PingRequest(5))).status is Status.BAD_REQUEST
    assert await early.closed_by_peer()
    await early.close()
    twice = await _connect(guard.cluster)
    again = HelloRequest(twice.next_id(), PROTOCOL_VERSION, "again", TOKEN)
    assert (await twice.request(again)).status is Status.BAD_REQUEST
    assert (await twice.request(PingRequest(twice.next_id()))).status is Status.OK  # Kept.
    await twice.close()
    future = await _connect(guard.cluster, hello=False)
    response = await future.request(HelloRequest(1, PROTOCOL_VERSION + 1, "future", TOKEN))
    assert response.status is Status.UNSUPPORTED_VERSION
    assert await future.closed_by_peer()
    await future.close()


async def test_wrong_auth_tokens_are_refused_counted_and_slowed(guard: Guard) -> None:
    before = _metric(guard.cluster, "bkaio_bookie_auth_failures_total")
    for token in (None, "", "guess", TOKEN[:-1], TOKEN + "!"):
        client = await _connect(guard.cluster, hello=False)
        client.send(HelloRequest(1, PROTOCOL_VERSION, "guesser", token))
        client.send(PingRequest(2))  # Never answered: nothing but the HELLO error.
        response = await client.read_response()
        assert response.status is Status.UNAUTHORIZED and response.request_id == 1
        assert await client.closed_by_peer()
        assert client.pending == []
        await client.close()
    assert _metric(guard.cluster, "bkaio_bookie_auth_failures_total") == before + 5
    assert _limit(guard.cluster, "auth_failure_delay") > 0


async def test_add_with_a_wrong_digest_stores_nothing(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    ledger_id, key = guard.canary.ledger_id, guard.canary.key
    bad = _add(client.next_id(), ledger_id, 10**5, b"forged", key, digest=12345)
    assert (await client.request(bad)).status is Status.BAD_DIGEST
    assert await _read_status(client, ledger_id, 10**5) is Status.NO_SUCH_ENTRY
    await client.close()


async def test_wrong_master_keys_neither_add_nor_fence(guard: Guard) -> None:
    """The canary keeps adding afterwards: had any of these fenced its ledger, it would fail."""
    client = await _connect(guard.cluster)
    ledger_id = guard.canary.ledger_id
    wrong = master_key(b"guess", ledger_id)
    add = _add(client.next_id(), ledger_id, 10**5, b"x", wrong)
    assert (await client.request(add)).status is Status.UNAUTHORIZED
    recovery = _add(client.next_id(), ledger_id, 10**5, b"x", wrong, flags=Flag.RECOVERY_ADD)
    assert (await client.request(recovery)).status is Status.UNAUTHORIZED
    fence_read = ReadEntryRequest(client.next_id(), ledger_id, 0, Flag.FENCE, wrong)
    assert (await client.request(fence_read)).status is Status.UNAUTHORIZED
    fence_range = ReadRangeRequest(client.next_id(), ledger_id, 0, 1, 100, Flag.FENCE, wrong)
    assert (await client.request(fence_range)).status is Status.UNAUTHORIZED
    fence_lac = ReadLacRequest(client.next_id(), ledger_id, Flag.FENCE, wrong, -1, 0)
    assert (await client.request(fence_lac)).status is Status.UNAUTHORIZED
    keyless = ReadLacRequest(client.next_id(), ledger_id, Flag.FENCE, None, -1, 0)
    assert (await client.request(keyless)).status is Status.UNAUTHORIZED
    await asyncio.sleep(0.2)
    await client.close()


async def test_an_entry_takes_only_identical_re_adds(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    ledger_id, key = guard.canary.ledger_id, guard.canary.key
    same = _add(client.next_id(), ledger_id, 0, canary_payload(0), key)
    assert (await client.request(same)).status is Status.OK
    other = _add(client.next_id(), ledger_id, 0, b"rewritten", key)
    assert (await client.request(other)).status is Status.ENTRY_CONFLICT
    read = ReadEntryRequest(client.next_id(), ledger_id, 0, Flag.NONE, None)
    stored = await client.request(read)
    assert isinstance(stored, ReadEntryResponse) and stored.entry is not None
    assert stored.entry.payload == canary_payload(0)
    await client.close()


async def test_requests_for_another_shards_ledger(guard: Guard) -> None:
    client = await _connect(guard.cluster, shard=0)
    odd = guard.canary.ledger_id + 1  # Shard 1's.
    add = _add(client.next_id(), odd, 0, b"x", master_key(PASSWORD, odd))
    assert (await client.request(add)).status is Status.WRONG_SHARD
    read = ReadEntryRequest(client.next_id(), odd, 0, Flag.NONE, None)
    assert (await client.request(read)).status is Status.WRONG_SHARD
    await client.close()


async def test_a_duplicate_request_id_in_flight_is_refused(guard: Guard) -> None:
    client = await _connect(guard.cluster)
    ledger_id = guard.canary.ledger_id
    poll = ReadLacRequest(77, ledger_id, Flag.LONG_POLL, None, 10**12, 300)
    client.send(poll)
    client.send(poll)
    first = await client.read_response()
    second = await client.read_response()
    assert (first.request_id, second.request_id) == (77, 77)
    assert (first.status, second.status) == (Status.BAD_REQUEST, Status.OK)
    assert (await client.request(PingRequest(78))).status is Status.OK
    await client.close()


async def test_a_client_that_never_reads_is_bounded(guard: Guard) -> None:
    """Thousands of pipelined reads and no reading: the bookie stops reading the socket."""
    cluster = guard.cluster
    before = _limit(cluster, "write_buffer_high_bytes") + _limit(
        cluster, "max_inflight_per_connection"
    )
    ledger_id, key = await _new_ledger(cluster)
    client = await _connect(cluster)
    big = _add(client.next_id(), ledger_id, 0, b"w" * (MAX_ENTRY_BYTES - 100), key)
    assert (await client.request(big)).status is Status.OK
    reads = b"".join(
        _frame(ReadEntryRequest(client.next_id(), ledger_id, 0, Flag.NONE, None).to_body())
        for _ in range(5_000)
    )
    client.send_raw(reads)  # 5000 reads of a 64 KiB entry (~320 MB of answers) never read.
    await asyncio.sleep(1.5)
    for pid in _workers(cluster[0].pid):
        assert _rss_bytes(pid) < RSS_BOUND_BYTES
    after = _limit(cluster, "write_buffer_high_bytes") + _limit(
        cluster, "max_inflight_per_connection"
    )
    assert after > before
    client.writer.transport.abort()
    await client.close()


async def test_slow_loris_and_silent_connections_are_closed(guard: Guard) -> None:
    cluster = guard.cluster
    before = _limit(cluster, "hello_timeout") + _limit(cluster, "frame_read_timeout")
    dribbler = await _connect(cluster, hello=False)  # HELLO at one byte per 0.4 s.
    hello = _frame(HelloRequest(1, PROTOCOL_VERSION, "slow", TOKEN).to_body())
    half = await _connect(cluster)  # After HELLO: a frame that never completes.
    half.send_raw(_frame(PingRequest(2).to_body())[:3])
    silent = await _connect(cluster, hello=False)

    async def dribble() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            for byte in hello:
                dribbler.send_raw(bytes([byte]))
                await dribbler.writer.drain()
                await asyncio.sleep(0.4)

    task = asyncio.create_task(dribble())
    for client in (dribbler, half, silent):
        assert await client.closed_by_peer(timeout_seconds=10)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for client in (dribbler, half, silent):
        await client.close()
    after = _limit(cluster, "hello_timeout") + _limit(cluster, "frame_read_timeout")
    assert after >= before + 3


async def test_reset_mid_frame_and_half_open_connections_are_cleaned_up(guard: Guard) -> None:
    cluster = guard.cluster
    before = _limit(cluster, "idle_timeout")
    reset = await _connect(cluster)
    reset.send_raw(_frame(PingRequest(9).to_body())[:4])
    await reset.writer.drain()
    sock = reset.writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.writer.transport.abort()  # RST, not FIN.
    idle = await _connect(cluster)  # Half-open: says HELLO, then nothing, ever.
    assert await idle.closed_by_peer(timeout_seconds=10)
    await idle.close()
    assert _limit(cluster, "idle_timeout") > before


async def test_range_reads_are_capped(guard: Guard) -> None:
    cluster = guard.cluster
    ledger_id, key = await _new_ledger(cluster)
    client = await _connect(cluster)
    adds = [_add(client.next_id(), ledger_id, e, b"r" * 100, key) for e in range(250)]
    responses = await client.pipeline(adds)
    assert {r.status for r in responses.values()} == {Status.OK}
    huge = ReadRangeRequest(client.next_id(), ledger_id, 0, 10**9, 2**62, Flag.NONE, None)
    answer = await client.request(huge)
    assert isinstance(answer, ReadRangeResponse) and answer.status is Status.OK
    assert 0 < len(answer.entries) <= 100
    assert [e.entry_id for e in answer.entries] == list(range(len(answer.entries)))
    assert _limit(cluster, "max_read_range_count") > 0
    await client.close()


async def test_long_polls_connections_and_payloads_are_capped(guard: Guard) -> None:
    cluster = guard.cluster
    ledger_id = guard.canary.ledger_id
    poller = await _connect(cluster)
    polls = [
        ReadLacRequest(poller.next_id(), ledger_id, Flag.LONG_POLL, None, 10**12, 500)
        for _ in range(24)
    ]
    answers = await poller.pipeline(polls, timeout_seconds=10)
    statuses = [answers[p.request_id].status for p in polls]
    assert statuses.count(Status.TOO_MANY_REQUESTS) >= 24 - 16
    assert set(statuses) <= {Status.OK, Status.TOO_MANY_REQUESTS}
    assert _limit(cluster, "max_long_poll_waiters") > 0
    big = _add(poller.next_id(), ledger_id, 10**5, b"b" * (MAX_ENTRY_BYTES + 1), guard.canary.key)
    assert (await poller.request(big)).status is Status.BAD_REQUEST
    assert _limit(cluster, "max_entry_bytes") > 0
    await poller.close()
    before = _limit(cluster, "max_connections")
    crowd: list[RawClient] = []
    for _ in range(60):  # Above max_connections (48) with the canary and the rest.
        crowd.append(await _connect(cluster, hello=False))
    closed = await asyncio.gather(*(c.closed_by_peer(timeout_seconds=0.5) for c in crowd))
    assert sum(closed) >= 60 - 48
    assert _limit(cluster, "max_connections") > before
    for client in crowd:
        await client.close()


# --- random frames ----------------------------------------------------------------------------

_fields = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.binary(max_size=64),
    st.text(max_size=16),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3),
)
_bodies = st.builds(
    lambda op, request_id, rest: [op, request_id, *rest],
    st.sampled_from([int(op) for op in Op] + [12, 255]),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.lists(_fields, max_size=10),
)
_frames = st.one_of(
    _bodies.map(_frame),
    st.binary(min_size=1, max_size=200),
    st.binary(max_size=100).map(lambda b: struct.pack(">I", len(b)) + b),
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=_frames)
async def test_random_frames_never_hurt_the_bookie(guard: Guard, data: bytes) -> None:
    client = await _connect(guard.cluster)
    client.send_raw(data)
    with contextlib.suppress(ConnectionError, OSError):
        await client.writer.drain()
    # Either answers and/or a close; never a hang past the frame deadline, never a crash.
    answered: list[Response] = []
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(0.3):
            while True:
                answered.append(await client.read_response(timeout_seconds=0.3))
    for response in answered:
        assert isinstance(response.status, Status)
    await client.close()
    assert guard.cluster[0].running
