"""bkaio.errors: one exception class per wire status, and back again."""

from __future__ import annotations

import inspect

import pytest

from bkaio import errors
from bkaio.errors import (
    STATUS_ERRORS,
    BKError,
    BKTimeoutError,
    BookieUnavailableError,
    error_for_status,
    status_for_error,
)
from bkaio.protocol.status import Status

ERROR_STATUSES = [status for status in Status if status is not Status.OK]


def test_every_status_but_ok_has_a_row() -> None:
    missing = set(ERROR_STATUSES) - set(STATUS_ERRORS)
    assert not missing, f"Status members without an exception class: {sorted(missing)}"
    assert Status.OK not in STATUS_ERRORS


@pytest.mark.parametrize("status", ERROR_STATUSES, ids=lambda status: status.name)
def test_each_row_is_a_proper_bkerror_subclass(status: Status) -> None:
    error_class = STATUS_ERRORS[status]
    assert issubclass(error_class, BKError)
    assert error_class is not BKError


def test_each_status_has_its_own_class() -> None:
    classes = list(STATUS_ERRORS.values())
    assert len(set(classes)) == len(classes), "one class serves two statuses"


@pytest.mark.parametrize("status", ERROR_STATUSES, ids=lambda status: status.name)
def test_error_for_status_round_trips_through_status_for_error(status: Status) -> None:
    error = error_for_status(status, f"bookie said {status.name}")
    assert type(error) is STATUS_ERRORS[status]
    assert str(error) == f"bookie said {status.name}"
    assert status_for_error(error) is status


@pytest.mark.parametrize("status", ERROR_STATUSES, ids=lambda status: status.name)
def test_error_for_status_gives_the_mapped_class(status: Status) -> None:
    error = error_for_status(status, "message")
    assert isinstance(error, STATUS_ERRORS[status])
    assert str(error) == "message"


def test_error_for_ok_is_a_programmer_error() -> None:
    with pytest.raises(AssertionError):
        error_for_status(Status.OK, "fine")


def _bkerror_classes() -> list[type[BKError]]:
    return [
        value
        for _, value in inspect.getmembers(errors, inspect.isclass)
        if issubclass(value, BKError)
    ]


@pytest.mark.parametrize("error_class", _bkerror_classes(), ids=lambda cls: cls.__name__)
def test_every_bkerror_class_travels_as_its_declared_status(error_class: type[BKError]) -> None:
    assert isinstance(error_class.status, Status)
    assert status_for_error(error_class("x")) is error_class.status


def test_unexpected_exceptions_travel_as_internal_error() -> None:
    assert status_for_error(RuntimeError("boom")) is Status.INTERNAL_ERROR
    assert status_for_error(KeyError("k")) is Status.INTERNAL_ERROR


def test_transient_errors_are_retriable() -> None:
    assert BookieUnavailableError.retriable and BKTimeoutError.retriable
    assert not errors.LedgerFencedError.retriable and not errors.ProtocolError.retriable
