"""A command whose stdout is closed under it (`bkaio bookie readjournal F | head`) stops quietly
with exit status 141, what a shell shows for a command SIGPIPE killed. click turned the
BrokenPipeError into a silent exit 1, the status of any failure.

The pipes here have their read end closed before the command writes, so every write fails."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bkaio.cli.main import EXIT_STDOUT_CLOSED, main
from bkaio.config import build_bookie_config
from bkaio.entrylog.shard_storage import ShardStorage
from bkaio.entrylog.types import StoredEntry
from bkaio.journal import open_journal
from bkaio.protocol.digest import entry_digest, master_key
from tests.fixtures.storage import add_entry

BKAIO = str(Path(sys.executable).parent / "bkaio")


@pytest.fixture
async def journal_file(tmp_path: Path) -> Path:
    """A journal file of one shard holding 50 entries."""
    config = build_bookie_config(
        {
            "bookie": {"host": "127.0.0.1", "port": 45181, "shards": 1},
            "metadata": {"uri": f"sqlite:///{tmp_path / 'meta.db'}"},
            "storage": {
                "journal_dirs": [str(tmp_path / "journal")],
                "ledger_dirs": [str(tmp_path / "ledgers")],
            },
            "journal": {"sync": False},
        },
        env={},
    )
    storage = await ShardStorage.open(
        config.storage[0],
        bookie_id=config.bookie_id,
        shard_index=0,
        shard_count=1,
        journal_factory=open_journal,
    )
    try:
        for entry_id in range(50):
            payload = b"entry %d" % entry_id
            digest = entry_digest(7, entry_id, entry_id - 1, len(payload), payload)
            entry = StoredEntry(7, entry_id, entry_id - 1, len(payload), digest, payload)
            await add_entry(storage, entry, master_key(b"", 7))
    finally:
        await storage.close()
    (journal,) = (tmp_path / "journal").rglob("*.jnl")
    return journal


@pytest.fixture
def closed_pipe() -> Iterator[int]:
    """The write end of a pipe nobody reads any more."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        yield write_end
    finally:
        os.close(write_end)


@pytest.mark.parametrize("options", [(), ("--json",)])
def test_readjournal_into_a_closed_pipe_stops_quietly(
    journal_file: Path,
    closed_pipe: int,
    options: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdout = open(os.dup(closed_pipe), "w", encoding="utf-8")  # noqa: SIM115 - closed below.
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["bookie", "readjournal", str(journal_file), *options]) == EXIT_STDOUT_CLOSED
        stdout.write("x" * 100_000)  # The exit's flush: the pipe was swapped for /dev/null.
        stdout.flush()
    finally:
        stdout.close()
    assert capsys.readouterr().err == ""


def test_the_bkaio_command_exits_141_without_a_word(journal_file: Path, closed_pipe: int) -> None:
    done = subprocess.run(
        [BKAIO, "bookie", "readjournal", str(journal_file)],
        stdout=closed_pipe,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (141, "")
