"""Several real processes on one metadata store (both drivers): id allocation and leases."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from bkaio.meta import open_metadata
from tests.integration.meta.helpers import eventually

REPO = Path(__file__).resolve().parents[3]
WORKERS = "tests.integration.meta.workers"


async def spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", WORKERS, *args, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def reap(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
    await process.communicate()


async def run_all(processes: list[asyncio.subprocess.Process]) -> list[tuple[bytes, bytes]]:
    """Every child's (stdout, stderr) once all have exited; kills them all on a timeout."""
    try:
        async with asyncio.timeout(120):
            return [await process.communicate() for process in processes]
    finally:
        for process in processes:
            await reap(process)


async def test_eight_processes_allocate_unique_ledger_ids(metadata_uri: str) -> None:
    count, block_size = 60, 7  # Small blocks: many counter races between the processes.
    async with await open_metadata(metadata_uri):
        pass  # Initialise the layout once, so the children race only on ids.
    processes = [
        await spawn("allocate", metadata_uri, str(count), str(block_size)) for _ in range(8)
    ]
    outputs = await run_all(processes)
    assert [process.returncode for process in processes] == [0] * 8, [err for _, err in outputs]
    per_process = [json.loads(out) for out, _ in outputs]
    for ids in per_process:
        assert ids == sorted(ids)  # Increasing within each allocator.
    every_id = [ledger_id for ids in per_process for ledger_id in ids]
    assert len(every_id) == len(set(every_id)) == 8 * count
    async with await open_metadata(metadata_uri) as meta:
        listed = [ledger_id async for ledger_id in meta.ledgers.list_ids(page_size=100)]
    assert listed == sorted(every_id)


async def test_processes_opening_a_new_sqlite_store_together_all_succeed(tmp_path: Path) -> None:
    # Bookies of one standalone cluster start at once on a metadata file none has created yet;
    # switching it to WAL mode used to fail one of them with "database is locked".
    files, processes_count = 12, 6
    start_at = time.time() + 2.0  # Time for every child to import and wait.
    processes = [
        await spawn("open-fresh", str(tmp_path), str(files), str(start_at))
        for _ in range(processes_count)
    ]
    outputs = await run_all(processes)
    failed = zip(processes, outputs, strict=True)
    errors = [err.decode() for process, (_, err) in failed if process.returncode]
    assert not errors, errors


async def test_registration_of_a_killed_bookie_disappears_within_ttl(metadata_uri: str) -> None:
    ttl_seconds = 2.0
    process = await spawn("register", metadata_uri, "127.0.0.1:4181", str(ttl_seconds))
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = await process.stdout.readline()
        assert line == b"registered\n", await process.stderr.read() if process.stderr else b""
        async with await open_metadata(metadata_uri) as meta:
            assert [info.bookie_id for info in await meta.bookies.list()] == ["127.0.0.1:4181"]
            await asyncio.sleep(ttl_seconds * 1.5)  # Kept alive past its TTL by the child.
            assert [info.bookie_id for info in await meta.bookies.list()] == ["127.0.0.1:4181"]

            process.send_signal(signal.SIGKILL)
            await process.wait()

            async def gone() -> bool:
                return await meta.bookies.list() == []

            assert await eventually(gone, timeout_seconds=ttl_seconds + 1.0, poll_seconds=0.05)
    finally:
        await reap(process)
