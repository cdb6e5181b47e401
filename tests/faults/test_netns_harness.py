"""The namespace network of tests/faults/harness/netns.py: TCP between two hosts, and what each
nft action does to it. An echo server runs in host `a` (started with `ip netns exec`, as bookies
are); probes run in host `b` through `run_in`. Skipped without root, ip or nft."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from tests.faults.harness.netns import NetnsNetwork, namespace_names, netns_available

ECHO_PORT = 7000
# A connect that has not happened in this long never will: an isolated host drops the SYNs.
BLOCKED_CONNECT_SECONDS = 1.0
# What an open TCP connection takes at most to deliver after a heal (retransmission backoff).
DELIVERY_SECONDS = 30.0

# Echoes lines and reports each on stdout, so the test can see what reached the server even
# when the answer does not come back (one-way partitions).
ECHO_SERVER = """
import socketserver, sys

class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            print("GOT", line.decode().strip(), flush=True)
            self.wfile.write(line)
            self.wfile.flush()

class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

with Server((sys.argv[1], int(sys.argv[2])), Echo) as server:
    print("READY", flush=True)
    server.serve_forever()
"""


@pytest.fixture
def net() -> Iterator[NetnsNetwork]:
    available = netns_available()
    if not available:
        pytest.skip(available.reason)
    network = NetnsNetwork.create(["a", "b"])
    try:
        yield network
    finally:
        network.close()


@dataclass
class EchoServer:
    process: asyncio.subprocess.Process
    address: str

    async def next_line(self) -> str:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), DELIVERY_SECONDS)
        return line.decode().strip()


@pytest.fixture
async def echo(net: NetnsNetwork) -> AsyncIterator[EchoServer]:
    process = await asyncio.create_subprocess_exec(
        *net.exec_prefix("a"),
        sys.executable,
        "-c",
        ECHO_SERVER,
        net.address("a"),
        str(ECHO_PORT),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        server = EchoServer(process, net.address("a"))
        assert await server.next_line() == "READY"
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def _connect_and_echo(address: str, text: str) -> str:
    """From inside a namespace: a fresh connection, one line there and back; the outcome."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(address, ECHO_PORT), BLOCKED_CONNECT_SECONDS
        )
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    try:
        writer.write(text.encode() + b"\n")
        return (await asyncio.wait_for(reader.readline(), DELIVERY_SECONDS)).decode().strip()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _probe(net: NetnsNetwork, text: str) -> str:
    return await net.run_in("b", lambda: _connect_and_echo(net.address("a"), text))


async def test_isolate_loss_and_heal(net: NetnsNetwork, echo: EchoServer) -> None:
    assert await _probe(net, "hello") == "hello"
    assert await echo.next_line() == "GOT hello"

    await asyncio.to_thread(net.isolate, "a")
    assert await _probe(net, "silent") == "timeout"
    await asyncio.to_thread(net.heal, "a")
    assert await _probe(net, "healed") == "healed"
    assert await echo.next_line() == "GOT healed"

    await asyncio.to_thread(net.isolate, "a", reset=True)
    assert await _probe(net, "reset") == "refused"
    await asyncio.to_thread(net.heal_all)

    await asyncio.to_thread(net.loss, "a", 30)  # Random: only that the kernel took the rule.
    assert "numgen random mod 100 < 30" in await asyncio.to_thread(net.rules, "a")
    await asyncio.to_thread(net.heal, "a")
    await asyncio.to_thread(net.loss, "a", 100)
    assert await _probe(net, "lost") == "timeout"
    await asyncio.to_thread(net.heal, "a")
    assert await _probe(net, "again") == "again"
    assert await echo.next_line() == "GOT again"
    assert "bkaio_fault" not in await asyncio.to_thread(net.rules, "a")


async def _socket_in(net: NetnsNetwork, host: str, address: str) -> socket.socket:
    """A TCP socket connected from inside `host`; it stays in that namespace wherever it is
    used, so the test's own loop can drive it next to the echo server's output."""

    async def connect() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (address, ECHO_PORT))
        except BaseException:
            sock.close()
            raise
        return sock

    return await net.run_in(host, connect)


async def test_one_way_partition_delivers_requests_but_not_answers(
    net: NetnsNetwork, echo: EchoServer
) -> None:
    reader, writer = await asyncio.open_connection(sock=await _socket_in(net, "b", echo.address))
    try:
        writer.write(b"before\n")
        assert await asyncio.wait_for(reader.readline(), DELIVERY_SECONDS) == b"before\n"
        assert await echo.next_line() == "GOT before"

        await asyncio.to_thread(net.drop_from, "b", "a")  # b hears nothing from a.
        writer.write(b"during\n")
        assert await echo.next_line() == "GOT during"  # The request arrives...
        with pytest.raises(TimeoutError):  # ...its answer does not.
            await asyncio.wait_for(reader.readline(), BLOCKED_CONNECT_SECONDS)

        await asyncio.to_thread(net.heal, "b")  # TCP retransmits the answer.
        assert await asyncio.wait_for(reader.readline(), DELIVERY_SECONDS) == b"during\n"
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def test_close_removes_every_namespace() -> None:
    available = netns_available()
    if not available:
        pytest.skip(available.reason)
    network = NetnsNetwork.create(["x", "y", "z"])
    try:
        network.isolate("x")
        names = [*network.namespaces.values(), network.switch]
        assert set(names) <= set(namespace_names())
    finally:
        network.close()
    assert not set(names) & set(namespace_names())
    network.close()  # Idempotent.
