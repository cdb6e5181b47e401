"""py-spy profiles of the client and of one bookie during a measured run (`bkaio bench --profile`).

py-spy (PyPI `py-spy`) samples another process from outside; `--nonblocking` keeps it from
pausing the target at each sample, so the profiled run's numbers move less (they are still
marked `profiled` in the results). `flamegraph` writes an SVG; `raw` writes collapsed stacks
(`frame;frame;frame count` lines) that `top_self_frames` summarizes into hot spots.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bkaio.bench.systems import BenchSetupError

ProfileFormat = Literal["flamegraph", "raw", "speedscope"]
SAMPLES_PER_SECOND = 250
SUFFIX: dict[ProfileFormat, str] = {"flamegraph": "svg", "raw": "txt", "speedscope": "json"}


def py_spy_binary() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise BenchSetupError("--profile needs py-spy: pip install py-spy")
    return found


@dataclass(slots=True)
class Recording:
    label: str
    output: Path
    process: asyncio.subprocess.Process


async def start_recording(
    label: str,
    pid: int,
    output_stem: Path,
    *,
    duration_seconds: float,
    profile_format: ProfileFormat,
    subprocesses: bool = False,
    native: bool = False,
) -> Recording:
    output = output_stem.with_name(f"{output_stem.name}-{label}.{SUFFIX[profile_format]}")
    argv = [
        py_spy_binary(),
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(SAMPLES_PER_SECOND),
        "--duration",
        str(max(1, round(duration_seconds))),
        "--format",
        profile_format,
        "--output",
        str(output),
    ]
    if not native:
        argv.append("--nonblocking")  # py-spy cannot unwind C stacks without pausing.
    if subprocesses:
        argv.append("--subprocesses")
    if native:
        argv.append("--native")  # C frames too (uvloop, msgpack, syscalls); costlier sampling.
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return Recording(label, output, process)


async def finish_recording(recording: Recording, *, timeout_seconds: float = 60.0) -> Path | None:
    """Wait for py-spy to write its file; None (and py-spy stopped) when it failed."""
    try:
        _stdout, stderr = await asyncio.wait_for(recording.process.communicate(), timeout_seconds)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            recording.process.kill()
        await recording.process.wait()
        return None
    if recording.process.returncode != 0 or not recording.output.exists():
        message = stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
        raise BenchSetupError(f"py-spy ({recording.label}) failed: {message[0][:300]}")
    return recording.output


def top_self_frames(raw_text: str, *, limit: int = 15) -> list[tuple[str, float]]:
    """The frames with the most samples at the top of the stack (self time), as % of samples.

    Input: py-spy `raw` output, one `frame;frame;...;leaf count` line per distinct stack.
    """
    self_samples: Counter[str] = Counter()
    total = 0
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        self_samples[stack.rsplit(";", 1)[-1].strip()] += count
    if total == 0:
        return []
    return [(frame, 100.0 * count / total) for frame, count in self_samples.most_common(limit)]


def top_inclusive_frames(raw_text: str, *, limit: int = 15) -> list[tuple[str, float]]:
    """Frames by the share of samples whose stack contains them (inclusive time), in %."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw_text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        for frame in set(stack.split(";")):
            inclusive[frame.strip()] += count
    if total == 0:
        return []
    return [(frame, 100.0 * count / total) for frame, count in inclusive.most_common(limit)]
