"""The suite's own guard (tests/fixtures/loop_errors.py, pyproject's filterwarnings): a test in
which an exception reaches the event loop's handler, or becomes unraisable, fails."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

_PLUGINS = ("-p", "tests.fixtures.loop_errors", "-p", "no:cacheprovider")

_STRAY_TASK = """
import asyncio


async def test_a_task_fails_and_nobody_looks() -> None:
    async def broken() -> None:
        raise ValueError("nobody awaits me")

    asyncio.get_running_loop().create_task(broken())
    await asyncio.sleep(0.01)
"""

_UVLOOP_CONFTEST = """
import uvloop

from tests.fixtures.loop_errors import recording


def pytest_asyncio_loop_factories(config, item):
    return {"uvloop": recording(uvloop.new_event_loop)}
"""

_BAD_CALLBACK = """
import asyncio


async def test_a_callback_raises() -> None:
    def bad() -> None:
        raise RuntimeError("callback bug")

    asyncio.get_running_loop().call_soon(bad)
    await asyncio.sleep(0.01)
"""

_EXPECTED = """
import asyncio


async def test_expects_its_report(loop_errors) -> None:
    asyncio.get_running_loop().call_soon(lambda: 1 / 0)
    await asyncio.sleep(0.01)
    (report,) = loop_errors.take()
    assert isinstance(report["exception"], ZeroDivisionError)
"""

_UNRAISABLE = """
class Broken:
    def __del__(self) -> None:
        raise ValueError("in a finaliser")


def test_a_finaliser_raises() -> None:
    Broken()
"""


def _run(pytester: pytest.Pytester, source: str, *, conftest: str = "") -> pytest.RunResult:
    pytester.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings = error\n"
    )
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(test_it=source)
    return pytester.runpytest_inprocess(*_PLUGINS)


def test_an_unawaited_task_failure_fails_the_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, _STRAY_TASK)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["*exceptions reached the event loop's handler:", "*ValueError: nobody awaits me"]
    )


def test_a_raising_callback_on_uvloop_fails_the_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, _BAD_CALLBACK, conftest=_UVLOOP_CONFTEST)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: callback bug*"])


def test_a_test_may_take_the_reports_it_expects(pytester: pytest.Pytester) -> None:
    _run(pytester, _EXPECTED).assert_outcomes(passed=1)


def test_an_unraisable_exception_fails_the_test(pytester: pytest.Pytester) -> None:
    result = _run(pytester, _UNRAISABLE)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*PytestUnraisableExceptionWarning*"])
