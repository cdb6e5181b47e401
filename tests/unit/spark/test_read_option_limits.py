"""Read options that planned in silence what the user cannot have meant: a batch read whose
startingOffsets lies past its endingOffsets (nothing read, no error), the streaming rate limits
on a batch read (ignored without a word; Spark's Kafka source warns), a minPartitions without
bound (a planner busy with millions of partitions), and `split_ranges(min_partitions=...)`,
which still took time in the square of the pieces it made (counted, not timed)."""

from __future__ import annotations

import itertools
import re

import pytest
from structlog.testing import capture_logs

from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.spark import catalog
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import MAX_MIN_PARTITIONS, parse_read_options
from bkaio.spark.planner import ReadRange, split_ranges
from bkaio.stream import open_namespace
from tests.unit.stream.conftest import ClientFactory

URI = "sqlite:///unused"


async def five_records(bk: BookKeeper) -> None:
    ns = await open_namespace(bk, "tenant", create=True)
    writer = await ns.open_writer("s")
    for i in range(5):
        await writer.write(b"%d" % i)
    await writer.close()


@pytest.mark.parametrize(
    ("starting", "ending", "shown"),
    [
        ('{"tenant/s": 4}', '{"tenant/s": 2}', "4) is past endingOffsets (seq 2"),
        ('{"tenant/s": 7}', "latest", "7) is past endingOffsets (seq 5"),
    ],
)
async def test_a_start_past_the_end_is_refused_naming_both(
    make_client: ClientFactory, starting: str, ending: str, shown: str
) -> None:
    bk = await make_client()
    await five_records(bk)
    options = parse_read_options(
        {
            "metadata": URI,
            "stream": "tenant/s",
            "startingOffsets": starting,
            "endingOffsets": ending,
        },
        streaming=False,
    )
    with pytest.raises(SparkOptionError, match=re.escape(f"startingOffsets (seq {shown}")):
        await catalog.plan_batch(bk, options)


async def test_a_start_at_the_end_reads_nothing_without_error(make_client: ClientFactory) -> None:
    bk = await make_client()
    await five_records(bk)
    options = parse_read_options(
        {
            "metadata": URI,
            "stream": "tenant/s",
            "startingOffsets": '{"tenant/s": 3}',
            "endingOffsets": '{"tenant/s": 3}',
        },
        streaming=False,
    )
    assert await catalog.plan_batch(bk, options) == []


@pytest.mark.parametrize("key", ["maxEntriesPerTrigger", "maxBytesPerTrigger"])
def test_rate_limits_on_a_batch_read_are_ignored_with_a_warning(key: str) -> None:
    raw = {"metadata": URI, "stream": "tenant/s", key: "10"}
    with capture_logs() as logs:
        parse_read_options(raw, streaming=False)
    ignored = [
        (e["log_level"], e["option"]) for e in logs if e["event"] == "spark_read_option_ignored"
    ]
    assert ignored == [("warning", key.lower())]
    with capture_logs() as logs:
        parse_read_options(raw, streaming=True)
    assert logs == []


def test_min_partitions_is_capped() -> None:
    raw = {"metadata": URI, "stream": "tenant/s"}
    options = parse_read_options({**raw, "minPartitions": str(MAX_MIN_PARTITIONS)}, streaming=False)
    assert options.min_partitions == MAX_MIN_PARTITIONS
    with pytest.raises(SparkOptionError, match=f"minPartitions={MAX_MIN_PARTITIONS + 1} is above"):
        parse_read_options({**raw, "minPartitions": str(MAX_MIN_PARTITIONS + 1)}, streaming=False)


def test_split_ranges_min_partitions_costs_work_in_proportion_to_the_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wanted = 2000
    counted = 0

    def counting(self: ReadRange) -> int:
        nonlocal counted
        counted += 1
        return self.last_entry_id - self.first_entry_id + 1

    monkeypatch.setattr(ReadRange, "entry_count", property(counting))
    ranges = [ReadRange("ns/s", 7, 0, 999_999, 0), ReadRange("ns/s", 8, 0, 499_999, 1_000_000)]
    pieces = split_ranges(ranges, max_entries=10_000_000, max_bytes=1 << 40, min_partitions=wanted)
    monkeypatch.undo()
    assert counted < 20 * wanted  # Was about wanted ** 2 / 2.
    assert len(pieces) == wanted
    assert [r.first_seq for r in pieces] == sorted(r.first_seq for r in pieces)
    assert all(b.first_seq == a.first_seq + a.entry_count for a, b in itertools.pairwise(pieces))
    assert sum(r.entry_count for r in pieces) == 1_500_000
