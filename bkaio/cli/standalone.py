"""`bkaio standalone`: a whole cluster on this host, for trying bkaio and for development.

Brings up a metadata store (the embedded SQLite store by default, a given URI, or a local etcd
process with `--etcd`) and N real bookie processes with one shard each, on loopback. The ports it
picks the first time (free ones, or from `--base-port`: standalone_layout.py) are remembered in
the data directory, so a restart finds the same bookies (bookie ids are host:port and their
cookies must match) and every ledger survives it.

The data directory is locked (`standalone.lock`, flock) while a standalone runs on it: a second
one exits at once naming the first one's pid instead of starting bookies on the same files.
Once the cluster is up, the standalone supervises its bookies: one that dies (kill -9, a crash)
is logged and started again after a jittered backoff (bkaio/backoff.py) while the others keep
serving; one that keeps dying young is given up on after `MAX_QUICK_DEATHS` in a row. Deaths,
restarts and give-ups are counted, and served with the standalone's own process_* figures on
`--metrics-port` (each bookie serves its own metrics on its admin port).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import structlog

from bkaio.backoff import Backoff
from bkaio.cli.common import run, start_metrics_server
from bkaio.cli.output import emit
from bkaio.cli.params import Int
from bkaio.cli.standalone_layout import (
    BASE_PORT,
    LOOPBACK,
    STATE_FILE,
    StandaloneLayout,
    load_layout,
    write_private,
)
from bkaio.errors import BKError
from bkaio.fault_switches import fault_switch_refusal
from bkaio.logs import configure_logging

log = structlog.get_logger(__name__)

READY_FILE = "ready.json"  # Exists while the cluster is up: the metadata URI and the bookies.
LOCK_FILE = "standalone.lock"  # flock-ed by the running standalone; holds its pid.
READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
POLL_SECONDS = 0.2
# Restarts of a dead bookie: the first after about half a second, doubling to at most 10 s. A
# bookie that lived HEALTHY_SECONDS before dying starts the schedule again; one that died
# younger MAX_QUICK_DEATHS times in a row has a problem no restart fixes (see its log).
RESTART_INITIAL_SECONDS = 0.5
RESTART_MAX_SECONDS = 10.0
HEALTHY_SECONDS = 30.0
MAX_QUICK_DEATHS = 8


class StandaloneError(BKError):
    """The standalone cluster could not start."""


class DataDirectoryLock:
    """An exclusive flock on `<data-dir>/standalone.lock`, held for the life of this process.

    The kernel drops it when the process exits however it exits, so a kill -9 leaves no stale
    lock. The file keeps the holder's pid for the error the next one prints.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:  # A read-only place, a path through a file: a bad --data-dir.
            raise click.BadParameter(
                f"{str(self.path.parent)!r} cannot hold a cluster: "
                f"{error.strerror or error} ({error.filename})",
                param_hint="'--data-dir'",
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StandaloneError(
                f"{self.path.parent} is in use by another bkaio standalone (pid {holder}); "
                "stop it first or use another --data-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # Closing the descriptor drops the flock.
            self._fd = None


def _write_atomically(path: Path, text: str) -> None:
    """Readers (scripts polling ready.json) see the old content or the new, never half."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


def _local_tls(data_dir: Path) -> Any:
    """The local CA and certificates of a --tls cluster (made once, then reused)."""
    from bkaio.security.local_ca import generate_local_tls

    return generate_local_tls((data_dir / "tls").resolve(), hosts=(LOOPBACK,))


def _bookie_toml(data_dir: Path, index: int, layout: StandaloneLayout) -> Path:
    bookie_dir = (data_dir / f"bookie-{index}").resolve()
    bookie_dir.mkdir(parents=True, exist_ok=True)
    config_path = bookie_dir / "bookie.toml"
    write_private(
        config_path,
        "\n".join(
            [
                "[bookie]",
                f'host = "{LOOPBACK}"',
                f"port = {layout.bookie_ports[index]}",
                "shards = 1",
                f'rack = "/standalone/rack-{index}"',
                "[metadata]",
                f'uri = "{layout.metadata_uri}"',
                "registration_ttl_seconds = 5.0",
                "[admin]",
                f'host = "{LOOPBACK}"',
                f"port = {layout.admin_ports[index]}",
                f'token = "{layout.admin_token}"',
                "[storage]",
                f'journal_dirs = ["{bookie_dir / "journal"}"]',
                f'ledger_dirs = ["{bookie_dir / "ledgers"}"]',
                "[read_only]",
                "disk_check_interval_seconds = 5.0",
                _local_tls(data_dir).bookie_toml(require_client_cert=True) if layout.tls else "",
                "",
            ]
        ),
    )
    return config_path


@dataclass(slots=True)
class SupervisedBookie:
    """One bookie process and what the supervisor knows of it."""

    index: int
    config_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # Set while a dead bookie waits for its restart.
    quick_deaths: int = 0  # Deaths in a row, each before HEALTHY_SECONDS of life.
    restarts: int = 0
    given_up: bool = False
    log_offset: int = 0  # Where this run's lines start in the log (earlier runs' come before).
    backoff: Backoff = field(
        default_factory=lambda: Backoff(RESTART_INITIAL_SECONDS, RESTART_MAX_SECONDS)
    )

    @property
    def log_path(self) -> Path:
        return self.config_path.parent / "bookie.log"

    def spawn(self, now: float | None = None) -> None:
        """Start the bookie process; `now` (time.monotonic()'s clock) is when, for its age."""
        with self.log_path.open("ab") as log_file:
            self.log_offset = log_file.tell()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bkaio.bookie", "--config", str(self.config_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us; we stop the bookies in order.
            )
        self.started_at = time.monotonic() if now is None else now
        self.restart_at = None

    def exit_reason(self) -> str:
        """The line of this run's log that says why the bookie stopped: its last error, else
        its last line. Not simply the last line: a bookie that fails to start (a port in use, a
        cookie that does not match) logs the error, then its orderly stop at info level."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self.log_offset)
                lines = log_file.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            reason = _logged_error(line)
            if reason is not None:
                return reason[:300]
        return lines[-1][:300] if lines else ""


def _logged_error(line: str) -> str | None:
    """`event: error` of a JSON log line at level error or above; None for any other line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("level") not in ("error", "critical"):
        return None
    error = record.get("error")
    return f"{record.get('event')}: {error}" if error else str(record.get("event"))


class StandaloneMetrics:
    """What the supervisor counts, and the standalone process's own process_* figures (each
    bookie serves its own on its admin port); served with `--metrics-port`."""

    def __init__(self) -> None:
        # Imported here: every `bkaio` command imports this module, few run a standalone.
        from prometheus_client import CollectorRegistry, Counter, Gauge

        from bkaio.process_metrics import ProcessesCollector

        self.registry = CollectorRegistry()
        self.registry.register(ProcessesCollector(lambda: [("standalone", os.getpid())]))
        self.bookie_deaths = Counter(
            "bkaio_standalone_bookie_deaths",
            "Bookie processes of this standalone that exited on their own",
            ["bookie"],
            registry=self.registry,
        )
        self.bookie_restarts = Counter(
            "bkaio_standalone_bookie_restarts",
            "Bookie processes this standalone started again after they died",
            ["bookie"],
            registry=self.registry,
        )
        self.bookies_given_up = Gauge(
            "bkaio_standalone_bookies_given_up",
            "Bookies that died young too often in a row to be started again",
            registry=self.registry,
        )


class StandaloneCluster:
    """The processes of one standalone cluster; `stop()` is safe to call at any point."""

    def __init__(self, data_dir: Path, layout: StandaloneLayout) -> None:
        self.data_dir = data_dir
        self.layout = layout
        self.bookies: list[SupervisedBookie] = []
        self.etcd: Any = None
        self.metrics = StandaloneMetrics()

    def start(self) -> None:
        if self.layout.etcd_client_port:
            from bkaio.localproc import EtcdProcess

            self.etcd = EtcdProcess(self.data_dir / "etcd")
            self.etcd.client_port = self.layout.etcd_client_port
            self.etcd.peer_port = self.layout.etcd_peer_port
            self.etcd.start()
        from bkaio.meta import initialise_cluster_at

        # The one place besides the shell's initnewcluster/metaformat that creates a cluster.
        run(initialise_cluster_at(self.layout.metadata_uri, exist_ok=True))
        for index in range(len(self.layout.bookie_ports)):
            bookie = SupervisedBookie(index, _bookie_toml(self.data_dir, index, self.layout))
            bookie.spawn()
            self.bookies.append(bookie)
        run(self._wait_registered())

    async def _wait_registered(self) -> None:
        from bkaio.meta import open_metadata

        expected = {f"{LOOPBACK}:{port}" for port in self.layout.bookie_ports}
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        meta = await open_metadata(self.layout.metadata_uri)
        try:
            while True:
                self._check_children()
                registered = await meta.bookies.ids()
                if expected <= registered:
                    return
                if time.monotonic() > deadline:
                    missing = ", ".join(sorted(expected - registered))
                    raise StandaloneError(
                        f"bookies {missing} did not register within {READY_TIMEOUT_SECONDS} s; "
                        f"see {self.data_dir}/bookie-*/bookie.log"
                    )
                await asyncio.sleep(0.1)
        finally:
            await meta.close()

    def _check_children(self) -> None:
        """While starting: any bookie that exits is a start failure (its config, its disk)."""
        for bookie in self.bookies:
            if bookie.process is not None and bookie.process.poll() is not None:
                raise StandaloneError(
                    f"bookie {bookie.index} exited with {bookie.process.returncode}: "
                    f"{bookie.exit_reason()} (full log: {bookie.log_path})"
                )

    def supervise(self, now: float) -> bool:
        """Once up: log dead bookies and restart them after their backoff. True when a bookie
        was started again (the description changed)."""
        restarted = False
        for bookie in self.bookies:
            if bookie.given_up or bookie.process is None:
                continue
            if bookie.restart_at is None:
                code = bookie.process.poll()
                if code is None:
                    continue
                self._bookie_died(bookie, code, now)
            elif now >= bookie.restart_at:
                bookie.restarts += 1
                self.metrics.bookie_restarts.labels(bookie=str(bookie.index)).inc()
                log.info("standalone_bookie_restarting", bookie=bookie.index,
                         restarts=bookie.restarts)  # fmt: skip
                bookie.spawn(now)
                restarted = True
        return restarted

    def _bookie_died(self, bookie: SupervisedBookie, code: int, now: float) -> None:
        self.metrics.bookie_deaths.labels(bookie=str(bookie.index)).inc()
        lived = now - bookie.started_at
        if lived >= HEALTHY_SECONDS:
            bookie.quick_deaths = 0
            bookie.backoff.reset()
        else:
            bookie.quick_deaths += 1
        if bookie.quick_deaths > MAX_QUICK_DEATHS:
            bookie.given_up = True
            self.metrics.bookies_given_up.inc()
            log.error(
                "standalone_bookie_given_up", bookie=bookie.index, returncode=code,
                deaths_in_a_row=bookie.quick_deaths, reason=bookie.exit_reason(),
                log=str(bookie.log_path),
            )  # fmt: skip
            return
        delay = bookie.backoff.next_delay()
        bookie.restart_at = now + delay
        log.error(
            "standalone_bookie_died", bookie=bookie.index, returncode=code,
            lived_seconds=round(lived, 1), restart_in_seconds=round(delay, 2),
            reason=bookie.exit_reason(), log=str(bookie.log_path),
        )  # fmt: skip

    def describe(self) -> dict[str, Any]:
        tls = None
        if self.layout.tls:
            files = _local_tls(self.data_dir)
            tls = {
                "ca_file": str(files.ca_file),
                "client_cert_file": str(files.client_cert_file),
                "client_key_file": str(files.client_key_file),
            }
        scheme = "https" if self.layout.tls else "http"
        return {
            "metadata": self.layout.metadata_uri,
            "tls": tls,
            "pid": os.getpid(),
            "bookies": [
                {
                    "bookie_id": f"{LOOPBACK}:{port}",
                    # Its admin.tls is "auto": HTTPS with the local CA when --tls.
                    "admin_url": f"{scheme}://{LOOPBACK}:{admin}",
                    "pid": bookie.process.pid if bookie.process is not None else None,
                    "restarts": bookie.restarts,
                }
                for port, admin, bookie in zip(
                    self.layout.bookie_ports, self.layout.admin_ports, self.bookies, strict=False
                )
            ],
        }

    def stop(self) -> int:
        """SIGTERM every bookie (they drain and deregister), then etcd; the worst exit code."""
        worst = 0
        processes = [b.process for b in self.bookies if b.process is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                code = process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            worst = max(worst, abs(code))
        if self.etcd is not None:
            self.etcd.stop()
        return worst


def _client_env(description: dict[str, Any]) -> str:
    """The environment a `bkaio shell` command needs to reach this cluster."""
    env = f"BKAIO_METADATA={description['metadata']} "
    tls = description.get("tls")
    if tls:
        env += (
            f"BKAIO_TLS_CA={tls['ca_file']} BKAIO_TLS_CERT={tls['client_cert_file']} "
            f"BKAIO_TLS_KEY={tls['client_key_file']} "
        )
    return env


@click.command()
@click.option("--bookies", default=3, show_default=True, type=Int(1, 32))
@click.option(
    "--data-dir",
    default=".standalone",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
)
@click.option(
    "--metadata",
    "metadata_uri",
    default=None,
    metavar="URI",
    help="Use this metadata store instead of the embedded one.",
)
@click.option("--etcd", "use_etcd", is_flag=True, help="Start a local etcd process for metadata.")
@click.option(
    "--base-port",
    default=0,
    type=BASE_PORT,
    help="Listen on ports from BASE (1024..65334; 0, the default: free ports): bookie i on "
    "BASE+i, its admin HTTP on BASE+100+i, with --etcd etcd on BASE+200 and BASE+201. Taken "
    "on the data directory's first start; later starts keep its ports.",
)
@click.option(
    "--tls", is_flag=True, help="Mutual TLS between clients and bookies, with a local CA."
)
@click.option(
    "--metrics-port",
    default=0,
    type=Int(0, 65535),
    help="Serve the standalone's own metrics (bookie restarts, process_*) on this loopback port.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the cluster description as JSON.")
def standalone(
    bookies: int,
    data_dir: Path,
    metadata_uri: str | None,
    use_etcd: bool,
    base_port: int,
    tls: bool,
    metrics_port: int,
    as_json: bool,
) -> int:
    """Run a metadata store and N bookies on this host until Ctrl-C or SIGTERM."""
    refusal = fault_switch_refusal()
    if refusal is not None:
        raise click.UsageError(refusal)  # Exit 2, before anything starts.
    if use_etcd and metadata_uri:
        raise click.UsageError("--etcd and --metadata exclude each other")
    # Before anything touches the directory: a second standalone must change nothing in it.
    lock = DataDirectoryLock(data_dir)
    lock.acquire()
    try:
        # A long-running service: its own events (a bookie died, restarted) go to stderr.
        configure_logging(json=as_json, level=os.environ.get("BKAIO_LOG_LEVEL", "info"))
        # We hold the lock: a ready.json here was left by a standalone killed before it could
        # remove it, and must not tell anyone this cluster is up before it is.
        (data_dir / READY_FILE).unlink(missing_ok=True)
        layout = load_layout(data_dir, bookies, metadata_uri, use_etcd, base_port, tls)
        return _serve(data_dir, layout, as_json, metrics_port)
    finally:
        lock.release()


def _serve(data_dir: Path, layout: StandaloneLayout, as_json: bool, metrics_port: int) -> int:
    """Start the cluster, supervise it until a stop signal, stop it; the exit code."""
    bookies = len(layout.bookie_ports)
    cluster = StandaloneCluster(data_dir, layout)
    metrics_server = None
    if metrics_port:
        # Before any process starts: one it cannot serve stops nothing.
        metrics_server = start_metrics_server(metrics_port, LOOPBACK, cluster.metrics.registry)
    stopping = False

    def request_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    ready_path = data_dir / READY_FILE
    try:
        cluster.start()
        description = cluster.describe()
        _write_atomically(ready_path, json.dumps(description))
        human = "\n".join(
            [
                f"bkaio standalone: {bookies} bookies up",
                f"metadata  {layout.metadata_uri}",
                *(
                    f"bookie    {b['bookie_id']}  admin {b['admin_url']}"
                    for b in description["bookies"]
                ),
                f"try       {_client_env(description)}bkaio shell simpletest",
                f"admin     token in {data_dir / STATE_FILE} (for shell recover/decommission)",
                "stop      Ctrl-C",
            ]
        )
        emit(description, as_json=as_json, human=human)
        while not stopping:
            if cluster.supervise(time.monotonic()):
                _write_atomically(ready_path, json.dumps(cluster.describe()))  # The new pids.
            time.sleep(POLL_SECONDS)
    finally:
        ready_path.unlink(missing_ok=True)
        code = cluster.stop()
        if metrics_server is not None:
            metrics_server.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not as_json:
        click.echo("bkaio standalone: stopped", err=True)
    return 0 if code in (0, signal.SIGTERM) else 1
