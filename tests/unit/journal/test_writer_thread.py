"""The journal's writer thread: posted calls run in order, submit returns results, shutdown."""

from __future__ import annotations

import threading

import pytest

from bkaio.journal.writer_thread import WriterThread


def test_posted_and_submitted_calls_run_in_order_on_one_thread() -> None:
    writer = WriterThread("test-writer")
    seen: list[tuple[int, str]] = []
    try:
        for index in range(100):
            writer.post(lambda i=index: seen.append((i, threading.current_thread().name)))
        assert writer.submit(len, seen).result(timeout=5) == 100
    finally:
        writer.shutdown()
    assert [index for index, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"test-writer"}


def test_submit_carries_the_exception_and_the_thread_goes_on() -> None:
    writer = WriterThread("test-writer")
    try:
        with pytest.raises(ZeroDivisionError):
            writer.submit(lambda: 1 // 0).result(timeout=5)
        writer.post(lambda: 1 // 0)  # Only logged: a posted call reports its own outcome.
        assert writer.submit(lambda: "alive").result(timeout=5) == "alive"
    finally:
        writer.shutdown()


def test_shutdown_runs_what_was_queued_then_refuses_more() -> None:
    writer = WriterThread("test-writer")
    done = threading.Event()
    writer.post(done.set)
    writer.shutdown(wait=True)
    assert done.is_set()
    with pytest.raises(RuntimeError, match="shut down"):
        writer.post(done.set)
    with pytest.raises(RuntimeError, match="shut down"):
        writer.submit(done.set)
