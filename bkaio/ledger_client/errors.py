"""Error helpers of the ledger client; the error classes themselves live in `bkaio.errors`,
but for `RequestRefusedError`, the client's refinement of `ProtocolError`."""

from __future__ import annotations

from bkaio.errors import InvalidArgumentError, LedgerRecoveryError, ProtocolError

__all__ = ["InvalidArgumentError", "LedgerRecoveryError", "RequestRefusedError", "copy_error"]


class RequestRefusedError(ProtocolError):
    """A request refused for what it is, not for the bookie's state: the bookie answered
    BAD_REQUEST (an entry above its server.max_entry_bytes, a malformed add), or this client
    would not send a frame above its max_frame_bytes. Sent again, to this bookie or another,
    it is refused again; so it says nothing of the bookie's health (no ensemble change), and
    a ledger handle whose add is refused fails (its entry ids are consecutive: none may be
    skipped). Other `ProtocolError`s (a bookie sending garbage, the wrong shard) are the
    bookie's fault."""


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
