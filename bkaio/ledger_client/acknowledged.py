"""The last entry of an open ledger that its writer may have acknowledged, found without fencing.

The bookies' LAC lags the writer's: each entry carries the LAC from when it was sent, so a
burst of pipelined appends all carry the LAC from before the burst, and the explicit LAC comes
later, or never (it can be off; the writer can die). A reader that starts "at the end" from that
LAC re-delivers records the application already saw acknowledged; a reader that stops "at the
end" stops early. This finds the end exactly:

1. READ_LAC from every bookie of the last segment, until every write set has Qw - Qa + 1
   answers (as a LAC read does): the highest LAC, and the highest entry any bookie holds.
2. From max(LAC, first entry of the last segment - 1) + 1 on, each entry is read from every
   bookie of its write set. At least Qa digest-valid copies: the entry is durable (recovery
   would keep it: it finds every entry with one copy), count it and go on. Qw - Qa + 1 bookies
   without it: it was never acknowledged, and neither was anything after it (acks come in
   order); stop. Neither (bookies that did not answer): BookieUnavailableError, since the
   answer could be wrong both ways.

Every entry acknowledged before the call started is counted (Qa bookies held it by then, and
every entry before it too); entries acknowledged during the call may be counted or not.
The work is bounded by what the writer had in flight (entries past the LAC). Nothing is
fenced, so the writer goes on. Imports no transport code.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from bkaio.errors import BKError, BookieUnavailableError, NoSuchEntryError, NoSuchLedgerError
from bkaio.ledger_client.context import ClientContext
from bkaio.ledger_client.quorum import has_quorum_coverage, negatives_for_absence, write_set
from bkaio.ledger_client.types import LacAnswer
from bkaio.meta.ledger_metadata import LedgerMetadata
from bkaio.protocol.digest import verify_entry_digest

# Entries decided concurrently past the LAC (each asks its whole write set).
_PROBE_WINDOW = 32


async def last_acknowledged_entry(context: ClientContext, md: LedgerMetadata) -> int:
    """The highest entry id E such that entries 0..E are durable (see the module doc); -1
    when none. For a closed ledger, its last entry."""
    if md.is_closed:
        return md.last_entry_id
    first_of_last, ensemble = md.ensembles[-1]
    lac, highest = await _lac_and_highest(context, md, ensemble)
    entry_id = max(lac, first_of_last - 1)
    probes: deque[asyncio.Task[bool]] = deque()
    next_id = entry_id + 1
    try:
        while True:
            while next_id <= highest and len(probes) < _PROBE_WINDOW:
                probes.append(asyncio.ensure_future(_durable(context, md, ensemble, next_id)))
                next_id += 1
            if not probes or not await probes.popleft():
                return entry_id
            entry_id += 1
    finally:
        for probe in probes:
            probe.cancel()
        if probes:
            await asyncio.gather(*probes, return_exceptions=True)


async def _lac_and_highest(
    context: ClientContext, md: LedgerMetadata, ensemble: Sequence[str]
) -> tuple[int, int]:
    """(max LAC, max last entry id) over the segment's bookies, on quorum coverage."""
    ops = context.ops
    tasks: dict[asyncio.Task[LacAnswer], int] = {
        asyncio.ensure_future(ops.read_lac(bookie_id, md.ledger_id)): index
        for index, bookie_id in enumerate(ensemble)
    }
    answered: set[int] = set()
    lac = highest = -1
    failures: list[str] = []
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = tasks[task]
                error = task.exception()
                if error is None:
                    answer = task.result()
                    lac = max(lac, answer.lac)
                    highest = max(highest, answer.last_entry_id)
                    answered.add(index)
                elif isinstance(error, NoSuchLedgerError):
                    answered.add(index)
                elif isinstance(error, BKError):
                    failures.append(f"{ensemble[index]}: {error}")
                else:
                    raise error
        # Every answer is waited for: the highest entry any bookie holds bounds the search.
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not has_quorum_coverage(answered, len(ensemble), md.write_quorum, md.ack_quorum):
        raise BookieUnavailableError(
            f"ledger {md.ledger_id}: too few bookies answered READ_LAC to find the last "
            f"acknowledged entry ({'; '.join(failures)})"
        )
    return lac, highest


async def _durable(
    context: ClientContext, md: LedgerMetadata, ensemble: Sequence[str], entry_id: int
) -> bool:
    """True: Qa bookies of the write set hold `entry_id`; False: Qw - Qa + 1 do not."""
    bookies = [ensemble[i] for i in write_set(entry_id, len(ensemble), md.write_quorum)]
    ops = context.ops
    results = await asyncio.gather(
        *(ops.read_entry(bookie_id, md.ledger_id, entry_id) for bookie_id in bookies),
        return_exceptions=True,
    )
    copies = absent = 0
    failures: list[str] = []
    for bookie_id, result in zip(bookies, results, strict=True):
        if isinstance(result, NoSuchEntryError | NoSuchLedgerError):
            absent += 1
        elif isinstance(result, BKError):
            failures.append(f"{bookie_id}: {result}")
        elif isinstance(result, BaseException):
            raise result
        elif result.entry_id == entry_id and verify_entry_digest(
            md.ledger_id, entry_id, result.lac, result.length, result.payload, result.digest
        ):
            copies += 1
        else:
            failures.append(f"{bookie_id}: corrupt copy")
    if copies >= md.ack_quorum:
        return True
    if absent >= negatives_for_absence(md.write_quorum, md.ack_quorum):
        return False
    raise BookieUnavailableError(
        f"ledger {md.ledger_id}: cannot tell whether entry {entry_id} was acknowledged: "
        f"{copies} copies, {absent} bookies without it ({'; '.join(failures)})"
    )
