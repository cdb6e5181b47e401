"""Error helpers of the ledger client; the error classes themselves live in `bkaio.errors`."""

from __future__ import annotations

from bkaio.errors import InvalidArgumentError, LedgerRecoveryError

__all__ = ["InvalidArgumentError", "LedgerRecoveryError", "copy_error"]


def copy_error(error: BaseException) -> BaseException:
    """A fresh exception of the same class and message, for failing many futures with one cause.

    One exception instance raised from many awaiters would grow one shared traceback.
    """
    try:
        fresh = type(error)(*error.args)
    except TypeError:  # A constructor with another signature: share the instance after all.
        return error
    fresh.__cause__ = error.__cause__
    return fresh
