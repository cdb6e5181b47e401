"""The etcd TLS files are read on a thread, never on the event loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.uri import EtcdUri


async def test_tls_files_are_read_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {}
    for name in ("ca", "cert", "key"):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_bytes(b"not a real PEM: the channel is never used\n")
    readers: list[threading.Thread] = []
    read_bytes = Path.read_bytes

    def spied(path: Path) -> bytes:
        readers.append(threading.current_thread())
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", spied)
    config = EtcdUri(
        endpoints=(("127.0.0.1", 1),),
        root="/p",
        ca_file=str(files["ca"]),
        cert_file=str(files["cert"]),
        key_file=str(files["key"]),
    )
    connection = EtcdConnection("etcd://127.0.0.1:1/p", config)
    loop_thread = threading.current_thread()
    try:
        await connection.connect()
    finally:
        await connection.close()
    assert len(readers) == 3
    assert loop_thread not in readers
