"""The ports and metadata store of a `bkaio standalone` cluster, chosen once per data directory.

The first start picks them and writes them to `<data-dir>/standalone.json`; every later start
reads them back, so the bookies come back under the same ids (host:port) and their cookies
match. The ports are free ones this process picks, or, with `--base-port BASE`, a fixed plan:
bookie i on BASE+i, its admin HTTP on BASE+100+i, and with `--etcd` the etcd client and peer
ports on BASE+200 and BASE+201 (`port_offsets`). Whoever starts several standalones at once on
one machine (parallel test workers) gives each its own BASE, so that none picks a port another
is about to bind.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from bkaio.errors import ConfigError

LOOPBACK = "127.0.0.1"
STATE_FILE = "standalone.json"  # Ports chosen on first start; reused on every restart.

ADMIN_PORT_OFFSET = 100  # Bookie i's admin HTTP listens on BASE + 100 + i.
ETCD_PORT_OFFSET = 200  # With --etcd: its client port BASE + 200, its peer port BASE + 201.
LOWEST_BASE_PORT = 1024  # Below: privileged ports.
HIGHEST_BASE_PORT = 65535 - (ETCD_PORT_OFFSET + 1)  # The last port it takes is a real port.


def port_offsets(bookies: int, etcd: bool) -> list[int]:
    """The ports `--base-port BASE` makes a cluster of `bookies` listen on, less BASE."""
    offsets = [*range(bookies), *range(ADMIN_PORT_OFFSET, ADMIN_PORT_OFFSET + bookies)]
    return [*offsets, ETCD_PORT_OFFSET, ETCD_PORT_OFFSET + 1] if etcd else offsets


class BasePortType(click.ParamType):  # type: ignore[type-arg]  # generic only in click>=8.2
    """0 (free ports) or a first port from which the whole plan fits below 65536."""

    name = "BASE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = None
        if number is None or not (number == 0 or LOWEST_BASE_PORT <= number <= HIGHEST_BASE_PORT):
            self.fail(
                f"{value!r} is not a base port: want {LOWEST_BASE_PORT}..{HIGHEST_BASE_PORT} "
                f"(the cluster listens on ports up to BASE+{ETCD_PORT_OFFSET + 1}), or 0 for "
                "free ports",
                param,
                ctx,
            )
        return number


BASE_PORT = BasePortType()


@dataclass(slots=True)
class StandaloneLayout:
    """What a data directory remembers between runs."""

    metadata_uri: str
    bookie_ports: list[int]
    admin_ports: list[int]
    etcd_client_port: int = 0
    etcd_peer_port: int = 0
    # Shared by every bookie: autorecovery fetches ledger keys over the admin API with it.
    admin_token: str = ""
    tls: bool = False  # Bookies serve mutual TLS with a local CA in <data-dir>/tls.

    def ports(self) -> list[int]:
        """Every port the cluster listens on, in `port_offsets` order."""
        etcd = [self.etcd_client_port, self.etcd_peer_port] if self.etcd_client_port else []
        return [*self.bookie_ports, *self.admin_ports, *etcd]


def write_private(path: Path, text: str) -> None:
    """Files holding the admin token are readable by their owner only."""
    path.write_text(text)
    path.chmod(0o600)


def _free_port() -> int:
    from bkaio.localproc import free_port

    return free_port(LOOPBACK)


def load_layout(
    data_dir: Path,
    bookies: int,
    metadata_uri: str | None,
    use_etcd: bool,
    base_port: int,
    tls: bool,
) -> StandaloneLayout:
    """The data directory's layout; made (and written) on its first start."""
    state_path = data_dir / STATE_FILE
    if state_path.exists():
        layout = StandaloneLayout(**json.loads(state_path.read_text()))
        if not layout.admin_token or (tls and not layout.tls):  # Upgrades keep the data.
            layout.admin_token = layout.admin_token or secrets.token_hex(16)
            layout.tls = layout.tls or tls
            write_private(state_path, json.dumps(asdict(layout), indent=2))
        if len(layout.bookie_ports) != bookies:
            raise ConfigError(
                f"{data_dir} holds a {len(layout.bookie_ports)}-bookie cluster; start it with "
                f"--bookies {len(layout.bookie_ports)} or use another --data-dir"
            )
        if metadata_uri is not None and metadata_uri != layout.metadata_uri:
            raise ConfigError(
                f"{data_dir} was created with metadata {layout.metadata_uri}, not {metadata_uri}"
            )
        etcd = bool(layout.etcd_client_port)
        if base_port and layout.ports() != [base_port + o for o in port_offsets(bookies, etcd)]:
            raise ConfigError(
                f"{data_dir} was created with other ports (bookies on {layout.bookie_ports}) "
                f"than --base-port {base_port} gives; its bookie ids name them: start it "
                "without --base-port (it keeps its ports) or use another --data-dir"
            )
        return layout
    if base_port:
        bookie_ports = [base_port + i for i in range(bookies)]
        admin_ports = [base_port + ADMIN_PORT_OFFSET + i for i in range(bookies)]
    else:
        bookie_ports = [_free_port() for _ in range(bookies)]
        admin_ports = [_free_port() for _ in range(bookies)]
    layout = StandaloneLayout(
        metadata_uri="",
        bookie_ports=bookie_ports,
        admin_ports=admin_ports,
        admin_token=secrets.token_hex(16),
        tls=tls,
    )
    if use_etcd:
        if base_port:
            layout.etcd_client_port = base_port + ETCD_PORT_OFFSET
            layout.etcd_peer_port = base_port + ETCD_PORT_OFFSET + 1
        else:
            layout.etcd_client_port, layout.etcd_peer_port = _free_port(), _free_port()
        layout.metadata_uri = f"etcd://{LOOPBACK}:{layout.etcd_client_port}/bkaio"
    else:
        default = f"sqlite:///{(data_dir / 'meta.db').resolve()}"
        layout.metadata_uri = metadata_uri or default
    data_dir.mkdir(parents=True, exist_ok=True)
    write_private(state_path, json.dumps(asdict(layout), indent=2))
    return layout
