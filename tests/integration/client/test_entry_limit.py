"""The entry size limit against real bookies (server.max_entry_bytes = 1000): a client whose own
limit is the same refuses the oversized append before sending it, and goes on; a client with
a larger limit gets the bookies' BAD_REQUEST: the first refusing bookie may be replaced, the
second refusing the same entry fails the handle with RequestRefusedError (it used to churn
through every bookie to NotEnoughBookiesError).
"""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import InvalidArgumentError, ProtocolError
from bkaio.ledger_client import BookKeeper, RequestRefusedError
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES
from tests.fixtures.bookies import BookieClusterFactory

LIMIT = 1000
_GUARD_SECONDS = 30.0  # Hang guard only.


async def test_an_entry_above_the_bookies_limit_stops_the_handle_after_one_change_at_most(
    bookie_cluster_factory: BookieClusterFactory,
) -> None:
    cluster = await bookie_cluster_factory(count=4, config={"server": {"max_entry_bytes": LIMIT}})
    async with asyncio.timeout(_GUARD_SECONDS):
        same_limit = {"max_frame_bytes": LIMIT + FRAME_ENVELOPE_BYTES}
        async with BookKeeper.connect(cluster.metadata_uri, **same_limit) as bk:
            lh = await bk.create_ledger(3, 3, 2)
            assert await lh.append(b"a" * LIMIT) == 0
            with pytest.raises(InvalidArgumentError, match="above the entry limit"):
                lh.append(b"x" * (LIMIT + 1))
            assert await lh.append(b"b") == 1
            await lh.close()
            assert len(lh.metadata.ensembles) == 1 and lh.metadata.last_entry_id == 1
        async with BookKeeper.connect(cluster.metadata_uri) as bk:  # The default, larger limit.
            lh = await bk.create_ledger(3, 3, 2)
            assert await lh.append(b"a") == 0
            big, after = lh.append(b"x" * (LIMIT + 1)), lh.append(b"b")
            for future in (big, after):
                with pytest.raises(RequestRefusedError, match="BAD_REQUEST") as caught:
                    await future
                assert isinstance(caught.value, ProtocolError)
            await lh.close()
            md = await bk.get_ledger_metadata(lh.ledger_id)
            # The first bookie to refuse may be replaced (one change at most): the second
            # refusing the same entry stops the handle.
            assert len(md.ensembles) <= 2
            assert md.is_closed and md.last_entry_id == 0
