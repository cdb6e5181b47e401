"""A fault-test cluster: real bookie processes on one metadata URI, a proxy per client link.

    async with FaultCluster(tmp_path, etcd_uri, bookies=3, seed=seed) as cluster:
        writer = await cluster.client("w0")              # every link to a bookie via a proxy
        cluster.link("w0", 1).blackhole()                # this client's link to bookie 1
        cluster.bookies.kill9(2); await cluster.bookies.start(2)
        direct = await cluster.client("final", proxied=False)

Bookies are `tests.fixtures.bookies.BookieCluster` (one shard each, so a bookie has one port);
`injected` (a lazy or failing disk, a crash point, the ack-before-fsync mutation) reaches every
bookie through the test entry point `python -m bkaio.testing.bookie`; `env` holds configuration
overrides only (BKAIO_<SECTION>_<KEY>). A client's recovery-read policy (the F8 mutation) is an
argument of `client`. Everything started here stops in `close`, also when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from bkaio.ledger_client import BookKeeper
from bkaio.ledger_client.connections import BookieAddress, BookiePool
from bkaio.ledger_client.recovery import FENCED_RECOVERY_READS, RecoveryReadPolicy
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta import open_metadata
from bkaio.meta.bookies import BookieInfo
from bkaio.testing.bookie import InjectedParts
from bkaio.testing.history import History
from tests.faults.harness.proxy import LinkProxy
from tests.fixtures.bookies import NOTHING_INJECTED, BookieCluster, ConfigOverrides, _http_ok


@dataclass(frozen=True, slots=True)
class _Address:
    bookie_id: str
    host: str
    port: int
    shard_count: int


class FaultCluster:
    def __init__(
        self,
        base_dir: Path,
        metadata_uri: str,
        *,
        bookies: int = 3,
        seed: int = 0,
        env: dict[str, str] | None = None,
        config: ConfigOverrides | None = None,
        injected: InjectedParts = NOTHING_INJECTED,
    ) -> None:
        self.metadata_uri = metadata_uri
        self.seed = seed
        self.rng = random.Random(seed)
        self.history = History()
        self.bookies = BookieCluster(
            metadata_uri,
            base_dir,
            count=bookies,
            shards=1,
            config=config,
            env=env,
            injected=injected,
            registration_ttl_seconds=3.0,
        )
        self._links: dict[tuple[str, str], LinkProxy] = {}
        self._clients: list[BookKeeper] = []

    async def __aenter__(self) -> FaultCluster:
        try:
            await self.bookies.__aenter__()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def bookie_ids(self) -> list[str]:
        return self.bookies.bookie_ids

    def link(self, client_name: str, bookie: int | str) -> LinkProxy:
        bookie_id = bookie if isinstance(bookie, str) else self.bookie_ids[bookie]
        return self._links[(client_name, bookie_id)]

    def links(self, client_name: str | None = None) -> list[LinkProxy]:
        return [p for (c, _b), p in self._links.items() if client_name in (None, c)]

    async def start_bookie(self, index: int, injected: InjectedParts | None = None) -> None:
        """(Re)start bookie `index`, with `injected` parts for this run only (default: the
        cluster's; `NOTHING_INJECTED`: the production bookie)."""
        if self.bookies[index].running:
            await self.bookies.stop(index)
        await self.bookies.start(index, injected=injected)

    def kill9_together(self, indexes: list[int]) -> None:
        """SIGKILL several bookies at the same instant (no one runs on while another dies)."""
        processes = [self.bookies[i].process for i in indexes]
        for process in processes:
            assert process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for index in indexes:
            self.bookies.kill9(index)  # Reaps it and records the exit code.

    def spawn_under(self, index: int, prefix: list[str]) -> None:
        """Start bookie `index` with `prefix` before its command (a wrapper, a namespace)."""
        bookie = self.bookies[index]
        with bookie.log_path.open("ab") as log_file:
            bookie.process = subprocess.Popen(
                [*prefix, *self.bookies.command(index)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                env=self.bookies.env,
                start_new_session=True,
            )

    async def start_bookie_under(self, index: int, prefix: list[str]) -> None:
        """Start bookie `index` under a wrapper command (unshare --time, faketime, ...)."""
        bookie = self.bookies[index]
        if bookie.running:
            await self.bookies.stop(index)
        self.spawn_under(index, prefix)
        assert bookie.process is not None
        url = bookie.admin_url + "/api/v1/bookie/is_ready"
        async with asyncio.timeout(60):
            while not await asyncio.to_thread(_http_ok, url):
                if bookie.process.poll() is not None:
                    raise RuntimeError(f"bookie {index} exited:\n{bookie.log_tail()}")
                await asyncio.sleep(0.1)

    def heal_network(self) -> None:
        for proxy in self._links.values():
            proxy.heal()

    async def client(
        self,
        name: str,
        *,
        proxied: bool = True,
        recovery_reads: RecoveryReadPolicy = FENCED_RECOVERY_READS,
        **options: Any,
    ) -> BookKeeper:
        """A BookKeeper client; with `proxied`, each bookie is reached through its own proxy.
        `recovery_reads`: the client's recovery-read policy (proxied clients only)."""
        options.setdefault("client_id", name)
        if not proxied:
            assert recovery_reads is FENCED_RECOVERY_READS, "a policy needs a proxied client"
            bk = await BookKeeper.connect(self.metadata_uri, **options)
            self._clients.append(bk)
            return bk
        for bookie in self.bookies.bookies:
            key = (name, bookie.bookie_id)
            if key not in self._links:
                self._links[key] = await LinkProxy.start(
                    bookie.host, bookie.port, rng=random.Random(self.rng.random())
                )
        config = ClientConfig(**options)
        metadata = await open_metadata(self.metadata_uri)
        known: dict[str, BookieInfo] = {}
        links = {b: p for (c, b), p in self._links.items() if c == name}

        def resolve(bookie_id: str) -> BookieAddress | None:
            info = known.get(bookie_id)
            proxy = links.get(bookie_id)
            if info is None or proxy is None:
                return info
            return _Address(bookie_id, "127.0.0.1", proxy.port, info.shard_count)

        try:
            pool = BookiePool(config, resolve)
            bk = BookKeeper(
                ledgers=metadata.ledgers,
                ops=pool,
                config=config,
                metadata=metadata,
                recovery_reads=recovery_reads,
            )
            # Same wiring as BookKeeper.connect, with our resolver in front of the registry.
            bk._known = known
            await bk._start_bookie_watch()
        except BaseException:
            await metadata.close()
            raise
        self._clients.append(bk)
        return bk

    async def close_client(self, bk: BookKeeper) -> None:
        if bk in self._clients:
            self._clients.remove(bk)
        with contextlib.suppress(Exception):
            await bk.close()

    async def close(self) -> None:
        for bk in list(self._clients):
            await self.close_client(bk)
        for proxy in self._links.values():
            with contextlib.suppress(Exception):
                await proxy.close()
        self._links.clear()
        await self.bookies.close()
