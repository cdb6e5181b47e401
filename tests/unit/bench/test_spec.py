"""The workload spec: the shipped file resolves; every mistake is a BenchSpecError saying what."""

from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.bench.spec import BenchSpecError, default_spec_path, load_suite, read_suite
from bkaio.errors import BKError

MINIMAL = """
[defaults]
payload_bytes = 1024
[workloads.s]
shape = "serial"
appends = 100
[workloads.c]
shape = "closed"
outstanding = 10
duration_seconds = 4.0
[workloads.o]
shape = "open"
rate_per_second = 500
duration_seconds = 2
write_quorum = 2
peer = false
[suites.main]
workloads = ["s", "c", "o"]
repeats = 2
[suites.short]
workloads = ["s", "c"]
repeats = 1
time_scale = 0.5
warmup_seconds = 0.1
"""


def test_the_shipped_spec_defines_the_issue_workloads() -> None:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads.toml"
    full = read_suite(path, "full")
    assert full.repeats == 3
    by_label = {w.label: w for w in full.workloads}
    assert by_label["serial"].appends == 5000
    assert by_label["closed100"].outstanding == 100
    assert by_label["closed100"].duration_seconds == 20.0
    assert {by_label["open1000"].rate_per_second, by_label["open5000"].rate_per_second} == {
        1000.0,
        5000.0,
    }
    assert all(w.quorum == "E3/Qw3/Qa2" for w in full.workloads if not w.label.endswith("qw2"))
    assert {w.payload_bytes for w in full.workloads} == {100, 1024, 16384}
    assert not by_label["closed100-qw2"].peer and by_label["closed100-qw2"].write_quorum == 2
    assert by_label["open10000"].rate_per_second == 10000.0
    assert by_label["open10000"].duration_seconds == 20.0
    quick = read_suite(path, "quick")
    assert [w.label for w in quick.workloads] == [
        "serial",
        "closed100",
        "open1000",
        "open5000",
        "open10000",
    ]
    assert quick.workloads[1].duration_seconds == pytest.approx(2.0)


def test_the_shipped_spec_has_a_throughput_curve_from_1k_past_saturation() -> None:
    path = Path(__file__).resolve().parents[3] / "benchmarks" / "workloads.toml"
    full = read_suite(path, "full")
    rates = sorted(
        w.rate_per_second
        for w in full.workloads
        if w.shape == "open" and w.payload_bytes == 1024 and w.quorum == "E3/Qw3/Qa2"
    )
    assert rates[0] == 1000.0 and rates[-1] >= 40000.0  # closed100 saturates near 30-38k/s.
    assert len(rates) >= 6
    curve = read_suite(path, "curve")
    assert sorted(w.rate_per_second for w in curve.workloads) == rates


def test_default_spec_path_finds_the_checkout_file() -> None:
    assert default_spec_path().name == "workloads.toml"
    assert default_spec_path().exists()


def test_suite_resolution_merges_defaults_and_scales_quick_runs() -> None:
    main = load_suite(MINIMAL, "main")
    assert [w.label for w in main.workloads] == ["s", "c", "o"]
    assert main.workloads[2].quorum == "E3/Qw2/Qa2" and not main.workloads[2].peer
    assert main.workloads[2].describe() == "open 500/s 2s 1024B E3/Qw2/Qa2"
    short = load_suite(MINIMAL, "short")
    assert short.workloads[0].appends == 50
    assert short.workloads[1].duration_seconds == 2.0
    assert all(w.warmup_seconds == 0.1 for w in short.workloads)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[workloads", "not valid TOML"),
        ("[bogus]\n", "unknown top-level"),
        ("[suites.main]\nworkloads = []\n", "non-empty list"),
        ("[suites.main]\nworkloads = ['nope']\n", "undefined workload"),
        (
            "[workloads.a]\nshape='serial'\nappends=1\ncolour=3\n[suites.main]\nworkloads=['a']\n",
            "unknown key",
        ),
        ("[workloads.a]\nshape='zigzag'\nappends=1\n[suites.main]\nworkloads=['a']\n", "shape="),
        ("[workloads.a]\nshape='serial'\n[suites.main]\nworkloads=['a']\n", "appends > 0"),
        (
            "[workloads.a]\nshape='closed'\noutstanding=0\nduration_seconds=1\n"
            "[suites.main]\nworkloads=['a']\n",
            "outstanding=0",
        ),
        (
            "[workloads.a]\nshape='open'\nrate_per_second=10\n[suites.main]\nworkloads=['a']\n",
            "duration_seconds=0.0",
        ),
        (
            "[workloads.a]\nshape='serial'\nappends=1\nack_quorum=3\nwrite_quorum=2\n"
            "[suites.main]\nworkloads=['a']\n",
            "ack_quorum (3) <= write_quorum (2)",
        ),
        (
            "[workloads.a]\nshape='serial'\nappends=true\n[suites.main]\nworkloads=['a']\n",
            "not a boolean",
        ),
        (
            "[workloads.a]\nshape='serial'\nappends='many'\n[suites.main]\nworkloads=['a']\n",
            "wrong type",
        ),
        (
            "[workloads.a]\nshape='serial'\nappends=1\n[suites.main]\nworkloads=['a']\nrepeats=0\n",
            "repeats=0",
        ),
    ],
)
def test_bad_specs_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(BenchSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_suite(text, "main", source="t.toml")


def test_a_missing_suite_lists_the_defined_ones() -> None:
    with pytest.raises(BenchSpecError, match=r"no suite 'nightly'.*\['main', 'short'\]"):
        load_suite(MINIMAL, "nightly")


def test_an_unreadable_spec_file_is_a_bk_error(tmp_path: Path) -> None:
    with pytest.raises(BKError, match="cannot read workload spec"):
        read_suite(tmp_path / "absent.toml", "full")
