"""Jittered exponential backoff: the one retry schedule every bkaio loop uses.

Retries that wait the same delay in lock step (every client of a restarted bookie, every
bookie of a restarted etcd) arrive together and fail together. Each delay here is drawn at
random from the upper part of the exponential step ("equal jitter": between half the step and
the whole of it), so retries spread out while the schedule still grows.

`Backoff` is the schedule as a value (for state machines that retry from callbacks, such as a
connection's reconnect); `retry` runs an awaitable until it succeeds, the attempts or the time
run out, or an error that is not retryable comes.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


def jitter_source() -> random.Random:
    """A generator for one schedule's jitter, seeded from the global generator: a process that
    seeds `random` (the deterministic simulation does) gets the same delays on every run."""
    return random.Random(random.getrandbits(64))


@dataclass
class Backoff:
    """Delays of `initial * multiplier**n`, capped at `maximum`, each jittered down by up to
    `jitter` (a fraction of the step). `reset()` after a success starts again from `initial`."""

    initial: float
    maximum: float
    multiplier: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=jitter_source, repr=False)
    failures: int = 0  # Delays handed out since the last reset.

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(
                f"backoff needs 0 < initial ({self.initial}) <= maximum ({self.maximum})"
            )
        if self.multiplier < 1:
            raise ValueError(f"backoff multiplier {self.multiplier} must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter {self.jitter} must be in [0, 1]")

    def step(self) -> float:
        """The un-jittered delay the next `next_delay()` is drawn under."""
        # Past the cap the power is not computed: it would overflow a float after ~1000 steps.
        if self.initial * self.multiplier ** min(self.failures, 64) >= self.maximum:
            return self.maximum
        return self.initial * self.multiplier**self.failures

    def next_delay(self) -> float:
        """The delay before the next attempt; each call moves one step up the schedule."""
        step = self.step()
        self.failures += 1
        return step - self.jitter * step * self.rng.random()

    def reset(self) -> None:
        self.failures = 0


class RetriesExhaustedError(Exception):
    """`retry` gave up; `__cause__` is the last error."""


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    retry_on: tuple[type[BaseException], ...],
    attempts: int | None = None,
    deadline_seconds: float | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`await call()` until it returns; errors in `retry_on` are retried after a backoff delay.

    Bounded by `attempts` (calls in all) and/or `deadline_seconds` (no retry whose delay would end
    past it); at least one of them must be given. When they run out, RetriesExhaustedError is
    raised from the last error. Errors not in `retry_on` propagate at once. `on_retry(error,
    delay)` runs before each wait (log there).
    """
    if attempts is None and deadline_seconds is None:
        raise ValueError("retry needs attempts or deadline_seconds: unbounded retries are a bug")
    if attempts is not None and attempts < 1:
        raise ValueError(f"retry attempts {attempts} must be >= 1")
    deadline = None if deadline_seconds is None else clock() + deadline_seconds
    made = 0
    while True:
        made += 1
        try:
            return await call()
        except retry_on as error:
            delay = backoff.next_delay()
            out_of_attempts = attempts is not None and made >= attempts
            out_of_time = deadline is not None and clock() + delay > deadline
            if out_of_attempts or out_of_time:
                why = f"{made} attempts" if out_of_attempts else f"{deadline_seconds} s"
                raise RetriesExhaustedError(f"gave up after {why}: {error}") from error
            if on_retry is not None:
                on_retry(error, delay)
            await sleep(delay)
