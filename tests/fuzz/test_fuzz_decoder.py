"""The decoder fuzz target under pytest: its seed corpus, a hypothesis pass, a short atheris run.

The atheris run (coverage-guided, `BKAIO_FUZZ_SECONDS`, default 10 s) happens when atheris is
importable; the hypothesis pass always runs, so machines without atheris still fuzz.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bkaio.protocol.frames import FRAME_HEADER, encode_frame
from tests.fuzz.decoder_target import one_input

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus" / "decoder"
SEEDS = sorted(CORPUS.iterdir())


@pytest.mark.parametrize("seed", SEEDS, ids=[seed.name for seed in SEEDS])
def test_seed_corpus(seed: Path) -> None:
    one_input(seed.read_bytes())


_scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.binary(max_size=40),
    st.text(max_size=10),
    st.none(),
    st.booleans(),
    st.floats(),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
_bodies = st.builds(
    lambda op, rest: [op, *rest],
    st.integers(min_value=0, max_value=12),
    st.lists(_values, max_size=10),
)


def _mutate(frame: bytes, position: int, byte: int) -> bytes:
    if not frame:
        return frame
    index = position % len(frame)
    return frame[:index] + bytes([byte]) + frame[index + 1 :]


_streams = st.one_of(
    st.binary(max_size=600),
    st.lists(_bodies.map(encode_frame), min_size=1, max_size=5).map(b"".join),
    st.builds(
        _mutate,
        _bodies.map(encode_frame),
        st.integers(min_value=0),
        st.integers(min_value=0, max_value=255),
    ),
    st.binary(max_size=300).map(lambda body: FRAME_HEADER.pack(len(body)) + body),
)


@settings(max_examples=400, deadline=None)
@given(pattern=st.binary(max_size=7), stream=_streams)
def test_decoder_property_with_hypothesis(pattern: bytes, stream: bytes) -> None:
    one_input(bytes([len(pattern)]) + pattern + stream)


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed")
def test_short_atheris_run(tmp_path: Path) -> None:
    seconds = int(os.environ.get("BKAIO_FUZZ_SECONDS", "10"))
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work)
    result = subprocess.run(
        [
            sys.executable,
            str(HERE / "fuzz_decoder.py"),
            f"-max_total_time={seconds}",
            f"-artifact_prefix={tmp_path}/",
            "-print_final_stats=1",
            str(work),
        ],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=tmp_path,
    )
    crashes = sorted(path.name for path in tmp_path.glob("crash-*"))
    assert result.returncode == 0 and not crashes, (crashes, result.stderr[-4000:])
