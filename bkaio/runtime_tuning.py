"""Process-wide interpreter tuning for the hot paths: opt-in, called by whoever owns the process.

A bookie worker calls `tune_gc_for_throughput` once it is listening; the benchmark harness calls
it after connecting its client. A library must not change a host application's collector
behind its back, so `BookKeeper.connect` does not: an application that appends at high rates
may call it itself after start-up (docs/performance.md has the measurements).

- `gc.freeze()` moves every object alive now (modules, config, connections, caches) to the
  permanent generation: later collections no longer traverse them.
- The generation-0 threshold goes from CPython's 700 allocations to `gen0_threshold`: every add
  allocates a handful of container objects (futures, tuples, lists), so with 700 a young
  collection ran every ~100 appends. Nearly all of those objects die young without cycles
  (reference counting frees them), so the collections found almost nothing to do.
"""

from __future__ import annotations

import gc

import structlog

log = structlog.get_logger(__name__)

DEFAULT_GEN0_THRESHOLD = 50_000


def tune_gc_for_throughput(gen0_threshold: int = DEFAULT_GEN0_THRESHOLD) -> None:
    """Collect once, freeze what survives, and raise the young-generation threshold."""
    assert gen0_threshold > 0, gen0_threshold
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0_threshold, gc.get_threshold()[0]), gen1, gen2)
    log.debug("gc_tuned", gen0_threshold=gc.get_threshold()[0], frozen=gc.get_freeze_count())
