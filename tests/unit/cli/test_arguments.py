"""Every CLI argument is checked before anything runs: a bad one is one line and exit 2.

In-process through `bkaio.cli.main.main` (the console script's function), so the whole matrix
is fast; tests/integration/cli runs a few of them through the installed `bkaio` command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from bkaio.cli.main import cli, main
from bkaio.cli.params import MAX_ID, FiniteFloat, Int

# Never opened: validation comes first. Under /proc, where nothing can create the directory
# (tests run as root: a store path in a creatable place would exist once some run made it).
SQLITE = "sqlite:////proc/nonexistent/meta.db"


@pytest.fixture
def bookie_config(tmp_path: Path) -> str:
    path = tmp_path / "bookie.toml"
    data = tmp_path / "data"
    path.write_text(
        "\n".join(
            [
                "[bookie]",
                'host = "127.0.0.1"',
                "port = 45181",
                "shards = 2",
                "[metadata]",
                f'uri = "sqlite:///{tmp_path / "meta.db"}"',
                "[storage]",
                f'journal_dirs = ["{data / "journal"}"]',
                f'ledger_dirs = ["{data / "ledgers"}"]',
                "",
            ]
        )
    )
    return str(path)


@pytest.mark.parametrize(
    "args",
    [
        ("shell", "readledger", "-1"),
        ("shell", "ledgermetadata", "-5"),
        ("shell", "deleteledger", "-3"),
        ("shell", "readledger", "1", "5", "2"),
        ("shell", "readledger", "1", "-2"),
        ("shell", "readledger", "x"),
        ("shell", "readledger", str(2**63)),
        ("shell", "recover", "no-port"),
        ("shell", "decommission", "host:99999"),
        ("shell", "bookieinfo", "a/b:1"),
        ("shell", "bookiesanity", "host:0"),
        ("shell", "bookiesanity", "127.0.0.1:1", "--entries", "0"),
        ("shell", "bookiesanity", "127.0.0.1:1", "--check-timeout", "-1"),
        ("shell", "bookiesanity", "127.0.0.1:1", "--timeout", "0"),
        ("shell", "simpletest", "--entries", "0"),
        # One latency kept per entry: no bound let a mistyped count eat the host's memory.
        ("shell", "simpletest", "--entries", "1000001"),
        ("shell", "bookiesanity", "127.0.0.1:1", "--entries", "1000001"),
        ("shell", "simpletest", "-e", "2", "-w", "3"),
        ("shell", "simpletest", "-w", "1", "-a", "2"),
        ("shell", "nukeexistingcluster"),
        ("shell", "nosuchcommand"),
        # float() reads nan and inf: every float option refuses them (NaN passes any bound).
        ("shell", "listledgers", "--timeout", "nan"),
        ("shell", "listledgers", "--timeout", "inf"),
        ("shell", "bookiesanity", "127.0.0.1:1", "--check-timeout", "nan"),
        ("shell", "decommission", "h:1", "--grace", "nan"),
        ("shell", "decommission", "h:1", "--decommission-timeout", "inf"),
        ("shell", "lostbookierecoverydelay", "--set", "nan"),
        ("shell", "lostbookierecoverydelay", "--set", "-5"),
        ("shell", "lostbookierecoverydelay", "--set", "1e9"),
        ("shell", "lostbookierecoverydelay", "--set", "x"),
        ("shell", "lostbookierecoverydelay", "--get", "--set", "5"),
        ("shell", "autorecovery", "--enable", "--disable"),
    ],
)
def test_shell_arguments(args: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code = main([*args, "--metadata", SQLITE])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    "args",
    [
        ("autorecovery", "--enable", "--disable"),
        ("lostbookierecoverydelay", "--get", "--set", "5"),
    ],
)
def test_conflicting_switches_name_the_choices(
    args: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["shell", *args, "--metadata", SQLITE]) == 2
    assert "one of" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["recover", "decommission"])
def test_recover_and_decommission_need_the_admin_token(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without it no bookie gives a ledger's master key: every ledger failed, after the whole
    --recover-timeout (600 s) or --decommission-timeout (900 s), with HTTP 403s as the reason."""
    monkeypatch.delenv("BKAIO_ADMIN_TOKEN", raising=False)
    code = main(["shell", command, "127.0.0.1:1", "--metadata", SQLITE])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "--admin-token" in captured.err and captured.err.count("\n") == 1, captured


def test_a_recovery_plan_needs_no_admin_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BKAIO_ADMIN_TOKEN", raising=False)
    code = main(["shell", "recover", "127.0.0.1:1", "--query", "--metadata", SQLITE])
    assert code == 1 and "ClusterNotInitialisedError" in capsys.readouterr().err  # Went on.


@pytest.mark.parametrize(
    "uri",
    [
        "nosuchscheme://what",
        "etcd://host:notaport/x",
        "sqlite://relative.db",
        "etcd://h:1/x?y=1",
        "etcd://:2379/p",
        "etcd://user:pw@h:2379",
        "etcd://h:1/p?ca=",
        "etcd://h:1/p?timeout=nan",
        "sqlite:///tmp/%00x.db",
    ],
)
def test_metadata_uris_are_checked_up_front(uri: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shell", "listledgers", "--metadata", uri]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ("readjournal", "99999"),
        ("readjournal", "not-a-journal"),
        ("readjournal", "1", "--shard", "2"),
        ("readjournal", "1", "--journal", "1"),
        ("readentrylog", "12345"),
        ("readentrylog", "xyz"),
        ("readentrylog", "0", "--entryid", "1"),
        ("readentrylog", "0", "--startpos", "100", "--endpos", "10"),
        ("readentrylog", "0", "--shard", "3"),
        ("readentrylog", "0", "--disk", "1"),
        ("readentrylog", "0", "--ledgerid", "-1"),
        ("localconsistencycheck", "--shard", "-2"),
        ("updatecookie",),
        ("updatecookie", "--directories", "--old-bookie-id", "h:1"),
        ("updatecookie", "--old-bookie-id", "nonsense"),
        ("listfilesondisc", "--bogus"),
        ("readlog", "12345"),
    ],
)
def test_bookie_arguments(
    args: tuple[str, ...], bookie_config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bookie", *args, "--config", bookie_config])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "" and captured.err.count("\n") == 1, captured


@pytest.mark.parametrize(
    "args",
    [
        ("stream", "truncate", "ns/s", "--before", "garbage"),
        ("stream", "tail", "ns/s", "--from", "1:2"),
        ("autorecovery", "--lost-bookie-delay", "-1"),
        ("autorecovery", "--lost-bookie-delay", "nan"),
        ("stream", "retain", "--every", "nan"),
        ("stream", "retain", "--every", "inf"),
        ("stream", "create", "ns", "--retention-seconds", "nan"),
    ],
)
def test_other_arguments(args: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, "--metadata", SQLITE]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured


def _float_params(command: click.Command, path: str) -> Iterator[tuple[str, click.Parameter]]:
    for param in command.params:
        if isinstance(param.type, click.types.FloatParamType):
            yield f"{path} {param.name}", param
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _float_params(sub, f"{path} {name}")


def test_every_float_option_refuses_nan_and_inf() -> None:
    """One float type for the whole CLI: a new option typed click.FloatRange (or float, or a
    float default) would let `nan` through to the library."""
    found = dict(_float_params(cli, "bkaio"))
    assert (
        "bkaio shell listledgers metadata_timeout" in found
        and "bkaio stream retain interval" in found
    )
    assert {
        name for name, param in found.items() if not isinstance(param.type, FiniteFloat)
    } == set()


def _int_params(command: click.Command, path: str) -> Iterator[tuple[str, click.Parameter]]:
    for param in command.params:
        if isinstance(param.type, click.types.IntParamType):
            yield f"{path} {param.name}", param
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _int_params(sub, f"{path} {name}")


def test_every_integer_option_is_bounded() -> None:
    """One integer type for the whole CLI (params.Int): an option typed click.IntRange without
    a maximum (or int) let 10**23 through to the library."""
    found = dict(_int_params(cli, "bkaio"))
    assert "bkaio shell readledger ledger_id" in found
    assert "bkaio stream create quota_bytes" in found
    assert {name for name, param in found.items() if not isinstance(param.type, Int)} == set()
    for param in found.values():
        assert isinstance(param.type, Int) and param.type.max is not None
        assert param.type.max <= MAX_ID


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("stream", "create", "ns", "--quota-bytes", str(10**23)), "--quota-bytes"),
        (("stream", "create", "ns", "--ensemble-size", str(10**23)), "--ensemble-size"),
        (("stream", "tail", "ns/s", "--count", str(10**23)), "--count"),
        (("shell", "ledgermetadata", "abc"), "'abc' is not a valid integer."),
    ],
)
def test_a_huge_or_non_numeric_integer_is_a_usage_error(
    args: tuple[str, ...], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--metadata", SQLITE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and complaint in err and "Traceback" not in err, err


def test_format_names_the_key_of_a_directory_it_cannot_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The directory cannot be made: the error names storage.journal_dirs, and nothing that
    --force would wipe is wiped."""
    (tmp_path / "a-file").write_text("")
    ledgers = tmp_path / "ledgers"
    config = tmp_path / "bookie.toml"
    config.write_text(
        "\n".join(
            [
                "[bookie]",
                'host = "127.0.0.1"',
                "port = 45181",
                "shards = 1",
                "[metadata]",
                f'uri = "sqlite://{tmp_path / "meta.db"}"',
                "[storage]",
                f'journal_dirs = ["{tmp_path / "a-file" / "journal"}"]',
                f'ledger_dirs = ["{ledgers}"]',
                "",
            ]
        )
    )
    assert main(["shell", "initnewcluster", "--metadata", f"sqlite://{tmp_path / 'meta.db'}"]) == 0
    held = ledgers / "shard-0" / "entrylog" / "data"
    held.parent.mkdir(parents=True)
    held.write_text("kept")
    capsys.readouterr()
    assert main(["bookie", "format", "--force", "--config", str(config)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert error.startswith("bkaio: ConfigError: storage.journal_dirs: cannot create "), error
    assert held.read_text() == "kept"


def test_a_missing_config_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bookie", "info", "--config", "/nonexistent/bookie.toml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_bookie_command_needs_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bookie", "lastmark", "--json"]) == 2
    error = json.loads(capsys.readouterr().err)
    assert error == {"error": "--config FILE is required", "kind": "UsageError"}


def test_usage_errors_under_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shell", "readledger", "-1", "--json", "--metadata", SQLITE]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)
    assert error["kind"] == "UsageError" and "-1 is not in the range" in error["error"]


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (("tail", "ns/s", "--from", "-3"), "is not earliest, latest, a seq or LEDGER:ENTRY@SEQ"),
        (("tail", "ns/s", "--from=-1:0@5"), "is not earliest, latest, a seq or LEDGER:ENTRY@SEQ"),
        (("tail", "ns/s", "--from", f"{2**63}:0@1"), "each a whole number in [0, "),
        (("truncate", "ns/s", "--before", "-1"), "'-1' is not a seq or LEDGER:ENTRY@SEQ"),
        (("truncate", "ns/s", "--before=-1:-1@-1"), "is not a seq or LEDGER:ENTRY@SEQ"),
    ],
)
def test_a_bad_stream_position_names_every_form_it_may_take(
    args: tuple[str, ...], wanted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--from -3` was refused as "not LEDGER:ENTRY@SEQ", as if that were the only form, and
    negative fields in LEDGER:ENTRY@SEQ reached the stream layer (`truncate --before=-1:-1@-1`
    removed nothing and exited 0)."""
    assert main(["stream", *args, "--metadata", SQLITE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and wanted in err, err


@pytest.mark.parametrize("instance_id", ["", "bad id/x", "a b", "a" * 65, "é", "a\tb"])
def test_a_new_clusters_instance_id_is_a_plain_word(
    instance_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`initnewcluster --instance-id ""` created a cluster whose id was empty, which cookies
    read as "stamped before clusters were named"; any text was taken."""
    store = tmp_path / "meta.db"
    args = ["--metadata", f"sqlite://{store}", "--instance-id", instance_id]
    assert main(["shell", "initnewcluster", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not an instance id" in err, err
    assert not store.exists()
    uuid_id = "0f477eab-45c5-4bfd-8373-02cb68f56b6a"
    assert main(["shell", "initnewcluster", *args[:2], "--instance-id", uuid_id]) == 0
    assert uuid_id in capsys.readouterr().out
