"""A private network of Linux network namespaces, and nftables partitions on it (root only).

    available = netns_available()
    if not available:
        pytest.skip(available.reason)
    with NetnsNetwork.create(["b0", "b1", "client"]) as net:
        net.address("b0")                        # "10.213.<x>.10": this host's only address
        subprocess.Popen([*net.exec_prefix("b0"), sys.executable, "-m", "bkaio.bookie", ...])
        net.isolate("b0")                        # drop everything between b0 and the others
        net.isolate("b0", reset=True)            # the same, but TCP gets RSTs (fails at once)
        net.drop_from("client", "b0")            # one-way: client hears nothing from b0
        net.loss("b1", 20)                       # b1 drops 20 % of what it receives
        net.heal("b0"); net.heal_all()
        await net.run_in("client", coroutine_function)   # this process, inside `client`

Shape (reference/faults.md B0): a "switch" namespace holds a bridge; every host namespace has
one veth (`eth0`) whose peer is a port of that bridge, and an address in a /24 picked at random
inside 10.213.0.0/16. Nothing is added to the namespace this process runs in: all traffic of the
network stays inside our own namespaces. Faults are one nftables table (`inet bkaio_fault`) in
the host's namespace, replaced atomically by every action; it only matches `eth0`, so a host's
own loopback (a bookie's admin port on 127.0.0.1) keeps working.

Names are `bkt<pid>_<random>_<host>`: unique per run, and a later run can tell a stale
namespace (its pid is gone) from one in use (`sweep_stale_namespaces`). `close` deletes every
namespace it made, which also deletes their veths and nft tables, also when a test failed.
Synchronous: call the actions through `asyncio.to_thread` from a loop that must not stall.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

NAME_PREFIX = "bkt"
HOST_INTERFACE = "eth0"
FAULT_TABLE = "inet bkaio_fault"
_STALE_NAME = re.compile(rf"^{NAME_PREFIX}(\d+)_")
_CLONE_NEWNET = 0x40000000  # <sched.h>; os.setns only exists from Python 3.12.
_COMMAND_SECONDS = 10.0  # One ip/nft call; more means the kernel or the tool is stuck.


@dataclass(frozen=True, slots=True)
class Availability:
    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def _run(*command: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run an ip/nft command; RuntimeError with its stderr when it fails."""
    done = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=_COMMAND_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


@functools.cache
def netns_available() -> Availability:
    """Can this process build namespaces and load nft rules in them? Probed once per process."""
    if os.geteuid() != 0:
        return Availability(False, "network namespaces need root")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return Availability(False, f"`{tool}` is not installed (Debian package {package})")
    probe = f"{NAME_PREFIX}{os.getpid()}_probe{secrets.token_hex(3)}"
    try:
        _run("ip", "netns", "add", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return Availability(False, f"cannot create a network namespace: {error}")
    try:
        _run("ip", "netns", "exec", probe, "nft", "-f", "-", stdin=_ruleset([], []))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return Availability(False, f"nft does not work inside a network namespace: {error}")
    finally:
        _delete_namespace(probe)
    return Availability(True, "")


def namespace_names() -> list[str]:
    """Every named network namespace on this machine (`ip netns list`)."""
    listing = _run("ip", "netns", "list").stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def sweep_stale_namespaces() -> list[str]:
    """Delete namespaces of ours left by runs whose process is gone (a crashed or killed test
    session never reached its teardown). Namespaces of live runs are left alone."""
    swept = []
    for name in namespace_names():
        match = _STALE_NAME.match(name)
        if match is None or _pid_alive(int(match.group(1))):
            continue
        _delete_namespace(name)
        swept.append(name)
    return swept


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _delete_namespace(name: str) -> None:
    """Kill what still runs inside (only processes we started can be in a namespace of ours),
    then delete it. A namespace with a process left in it would outlive its name."""
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        for word in _run("ip", "netns", "pids", name).stdout.split():
            pid = int(word)
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        _run("ip", "netns", "delete", name)


def _ruleset(input_rules: Sequence[str], output_rules: Sequence[str]) -> str:
    """An nft script that replaces the fault table in one transaction (the `table` line makes
    the `delete` valid when the table does not exist yet); no rules: no table."""
    lines = [f"table {FAULT_TABLE}", f"delete table {FAULT_TABLE}"]
    if input_rules or output_rules:
        lines.append(f"table {FAULT_TABLE} {{")
        for chain, rules in (("input", input_rules), ("output", output_rules)):
            lines.append(f"  chain {chain} {{")
            lines.append(f"    type filter hook {chain} priority 0; policy accept;")
            lines.extend(f"    {rule}" for rule in rules)
            lines.append("  }")
        lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass
class _Faults:
    """The rules in force on one host, kept so that actions add up until `heal`."""

    input_rules: list[str] = field(default_factory=list)
    output_rules: list[str] = field(default_factory=list)


class NetnsNetwork:
    """A switch namespace with a bridge, and one namespace per host plugged into it."""

    def __init__(self, host_names: Sequence[str]) -> None:
        assert host_names and len(set(host_names)) == len(host_names), host_names
        assert len(host_names) <= 200, "one /24, addresses .10 upwards"
        token = f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
        self.subnet_octet = 1 + secrets.randbelow(254)  # Two runs never share a network anyway.
        self.switch = f"{token}_sw"
        self.namespaces = {host: f"{token}_{host}" for host in host_names}
        self._addresses = {
            host: f"10.213.{self.subnet_octet}.{10 + index}"
            for index, host in enumerate(host_names)
        }
        self._faults = {host: _Faults() for host in host_names}
        self._created: list[str] = []

    @classmethod
    def create(cls, host_names: Sequence[str]) -> NetnsNetwork:
        """Build the network; on any failure, remove what was built and raise."""
        sweep_stale_namespaces()
        network = cls(host_names)
        try:
            network._build()
        except BaseException:
            network.close()
            raise
        return network

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for index, (host, name) in enumerate(self.namespaces.items()):
            self._add_namespace(name)
            port = f"port{index}"
            # Made inside the host namespace with its peer sent straight to the switch: the
            # pair never appears in the namespace this process runs in.
            _run(
                "ip", "-n", name, "link", "add", HOST_INTERFACE, "type", "veth",
                "peer", "name", port, "netns", self.switch,
            )  # fmt: skip
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", name, "addr", "add", f"{self.address(host)}/24", "dev", HOST_INTERFACE)
            _run("ip", "-n", name, "link", "set", HOST_INTERFACE, "up")

    def __enter__(self) -> NetnsNetwork:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete every namespace made here (idempotent); veths and nft tables go with them."""
        while self._created:
            _delete_namespace(self._created.pop())

    # --- hosts -------------------------------------------------------------------------------

    @property
    def hosts(self) -> list[str]:
        return list(self.namespaces)

    def address(self, host: str) -> str:
        return self._addresses[host]

    def exec_prefix(self, host: str) -> list[str]:
        """Put this before a command to run it inside `host` (ip execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespaces[host]]

    async def run_in(self, host: str, function: Callable[[], Awaitable[T]]) -> T:
        """Run `function()` on a fresh event loop in a thread that entered `host`'s namespace,
        so sockets it opens live there. The thread ends with it, taking its namespace along;
        the calling loop only waits (keep objects it shares single-threaded that way)."""
        path = f"/run/netns/{self.namespaces[host]}"
        outcome: list[T] = []
        failure: list[BaseException] = []

        def body() -> None:
            try:
                _enter_network_namespace(path)
                outcome.append(asyncio.run(_call(function)))
            except BaseException as error:
                failure.append(error)

        thread = threading.Thread(target=body, name=f"netns-{host}", daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join)
        if failure:
            raise failure[0]
        return outcome[0]

    # --- faults ------------------------------------------------------------------------------

    def isolate(self, host: str, *, reset: bool = False) -> None:
        """Cut `host` off from every other host, both ways. `reset`: answer TCP with RSTs
        (peers fail at once) instead of silence (peers time out)."""
        faults = self._faults[host]
        if reset:
            # The RSTs that input's reject sends pass the output chain: let them out.
            faults.output_rules.append(f'oifname "{HOST_INTERFACE}" tcp flags & rst == rst accept')
        for rules, match in ((faults.input_rules, "iifname"), (faults.output_rules, "oifname")):
            if reset:
                rules.append(f'{match} "{HOST_INTERFACE}" meta l4proto tcp reject with tcp reset')
            rules.append(f'{match} "{HOST_INTERFACE}" drop')
        self._apply(host)

    def drop_from(self, host: str, peer: str) -> None:
        """One-way partition: `host` receives nothing from `peer`; what it sends still arrives."""
        rule = f'iifname "{HOST_INTERFACE}" ip saddr {self.address(peer)} drop'
        self._faults[host].input_rules.append(rule)
        self._apply(host)

    def loss(self, host: str, percent: int) -> None:
        """`host` drops `percent` % of the packets it receives from the network, at random."""
        assert 0 <= percent <= 100, percent
        if percent == 0:
            return
        # numgen yields 0..99 and nft refuses "< 100" as out of range: all is a plain drop.
        chance = "" if percent == 100 else f"numgen random mod 100 < {percent} "
        self._faults[host].input_rules.append(f'iifname "{HOST_INTERFACE}" {chance}drop')
        self._apply(host)

    def heal(self, host: str) -> None:
        self._faults[host] = _Faults()
        self._apply(host)

    def heal_all(self) -> None:
        for host in self.namespaces:
            self.heal(host)

    def rules(self, host: str) -> str:
        """The fault table as the kernel has it (for schedules and failure messages)."""
        listing = _run(*self.exec_prefix(host), "nft", "list", "ruleset")
        return listing.stdout

    def _apply(self, host: str) -> None:
        faults = self._faults[host]
        script = _ruleset(faults.input_rules, faults.output_rules)
        _run(*self.exec_prefix(host), "nft", "-f", "-", stdin=script)


async def _call(function: Callable[[], Awaitable[T]]) -> T:
    return await function()


def _enter_network_namespace(path: str) -> None:
    """setns(2) for the calling thread only; other threads keep their namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(descriptor, _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns({path}): {os.strerror(error)}")
    finally:
        os.close(descriptor)
