"""The retired fault switches: environment variables that once armed fault injection or a
deliberate mutation inside a production process.

No production process reads them any more: fault injection, crash points and mutations are
parts a test entry point passes in (`python -m bkaio.testing.bookie --disk ... --crash-point ...
--mutation ...`). A bookie, its shard worker, `bkaio standalone` and `bkaio autorecovery` refuse to
start while one is set, so whoever set it learns at once that it would do nothing, and where
fault injection lives now.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

RETIRED_FAULT_SWITCHES: Final = ("BKAIO_MUTATION", "BKAIO_FAULT_DISK", "BKAIO_CRASHPOINT")
TEST_ENTRY_POINT: Final = "python -m bkaio.testing.bookie"


def fault_switch_refusal(environ: Mapping[str, str] = os.environ) -> str | None:
    """One line saying why a process must not start with these variables set, or None."""
    found = [name for name in RETIRED_FAULT_SWITCHES if name in environ]
    if not found:
        return None
    names = " and ".join(found)
    return (
        f"refusing to start: {names} {'is' if len(found) == 1 else 'are'} set, but production "
        f"processes read no test switch; fault injection and mutations are options of the test "
        f"entry point `{TEST_ENTRY_POINT}` (--disk, --crash-point, --mutation). Unset {names}."
    )
