"""Coverage-guided fuzzing of the wire decoder with atheris (libFuzzer). Not a pytest module.

    python tests/fuzz/fuzz_decoder.py -max_total_time=60 WORK_CORPUS tests/fuzz/corpus/decoder

libFuzzer writes new interesting inputs into the first corpus directory: give it a scratch copy
(`make fuzz` does). A finding is written as crash-<sha1> (see -artifact_prefix) and can be replayed
with `python tests/fuzz/fuzz_decoder.py crash-<sha1>`; add it to the corpus once fixed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris  # Untyped; pyproject tells mypy so. Only this script uses it.

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # The repository root.

with atheris.instrument_imports(include=["bkaio", "msgpack"]):
    from tests.fuzz.decoder_target import one_input


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
