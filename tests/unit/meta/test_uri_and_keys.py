"""Metadata URIs, key layout helpers (and the ledger id check they make) and BookieInfo checks."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from bkaio.errors import ConfigError, InvalidArgumentError
from bkaio.meta import LedgerIdGenerator, LedgerManager, open_store
from bkaio.meta.bookies import (
    BookieInfo,
    decode_bookie_info,
    encode_bookie_info,
    registration_key,
)
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.ledgers import check_ledger_id, ledger_id_of, ledger_key
from bkaio.meta.store import KeyValue, prefix_end
from bkaio.meta.uri import EtcdUri, parse_etcd_uri, parse_sqlite_uri


def test_etcd_uri_with_several_endpoints_and_options() -> None:
    parsed = parse_etcd_uri(
        "etcd://10.0.0.1:2379,etcd-2:2380/clusters/a?ca=/ca.pem&user=u&password=p&timeout=2.5"
    )
    assert parsed.endpoints == (("10.0.0.1", 2379), ("etcd-2", 2380))
    assert parsed.root == "/clusters/a"
    assert (parsed.ca_file, parsed.user, parsed.password) == ("/ca.pem", "u", "p")
    assert parsed.operation_timeout_seconds == 2.5


def test_etcd_uri_defaults() -> None:
    parsed = parse_etcd_uri("etcd://localhost")
    assert parsed.endpoints == (("localhost", 2379),)
    assert parsed.root == "/bkaio"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://x:1/p", "scheme must be etcd"),
        ("etcd:///p", "no etcd endpoint"),
        ("etcd://host:notaport/p", "bad endpoint"),
        ("etcd://host:1/p?colour=red", "unknown option"),
        ("etcd://host:1/p?user=u", "user and password go together"),
        ("etcd://host:1/p?cert=c", "cert and key go together"),
        ("etcd://host:1/p?timeout=-1", "timeout='-1' must be a finite number of seconds > 0"),
        # float() reads these: NaN passes a `<= 0` check, infinity waits forever.
        ("etcd://host:1/p?timeout=nan", "timeout='nan' must be a finite number"),
        ("etcd://host:1/p?connect_timeout=nan", "connect_timeout='nan' must be a finite"),
        ("etcd://host:1/p?retry_seconds=NaN", "retry_seconds='NaN' must be a finite"),
        ("etcd://host:1/p?connect_timeout=inf", "connect_timeout='inf' must be a finite"),
        # An empty file option would read as absent: no TLS at all.
        ("etcd://host:1/p?ca=", "ca= is empty"),
        ("etcd://host:1/p?cert=&key=", "cert= is empty"),
        ("etcd://host:1/p?cert=/c.pem&key=", "key= is empty"),
        ("etcd://host:1/p?key=/k.pem", "cert and key go together"),
        # Mistyped endpoints: refused here, not at connect after the timeout.
        ("etcd://:2379/p", "bad endpoint ':2379': no host"),
        ("etcd://h:1,,h:2/p", "bad endpoint '': no host"),
        ("etcd://user:pw@h:2379", "credentials do not go before the host.*user=NAME&password="),
        ("etcd://h:0/p", "port '0' is not a number in"),
        ("etcd://h:65536/p", "port '65536' is not a number in"),
        ("etcd://h:\u00b2/p", "port '\u00b2' is not a number in"),  # isdigit, yet not int().
    ],
)
def test_bad_etcd_uris_say_what_is_wrong(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_etcd_uri(uri)


def test_etcd_endpoints_in_brackets_take_the_default_port() -> None:
    parsed = parse_etcd_uri("etcd://[::1],[fd00::2]:2380/p")
    assert parsed.endpoints == (("::1", 2379), ("fd00::2", 2380))


@pytest.mark.parametrize(
    "uri",
    [
        "etcd://bkaio:s3cret@h:2379/p",
        "etcd://h:1/p?user=bkaio&password=s3cret&colour=red",
        "etcd://h:1/p?user=bkaio&password=s3cret&timeout=nan",
    ],
)
def test_uri_errors_do_not_show_the_password(uri: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_etcd_uri(uri)
    assert "s3cret" not in str(error.value) and "metadata URI 'etcd://" in str(error.value)


async def test_an_empty_tls_file_name_is_an_error_not_a_plain_channel() -> None:
    """Past the parser (an EtcdUri built in code), an empty CA is read as a file and fails:
    it never means "no TLS"."""
    config = EtcdUri(endpoints=(("127.0.0.1", 1),), root="/p", ca_file="")
    connection = EtcdConnection("etcd://127.0.0.1:1/p", config)
    with pytest.raises(ConfigError, match="cannot read TLS file"):
        await connection.connect()
    assert connection.members == []


def test_sqlite_uri() -> None:
    parsed = parse_sqlite_uri("sqlite:///var/lib/bkaio/meta.db?synchronous=normal")
    assert (parsed.path, parsed.synchronous, parsed.root) == (
        "/var/lib/bkaio/meta.db",
        "normal",
        "",
    )


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("sqlite://host/meta.db", "host 'host' not allowed"),
        ("sqlite://relative.db", "not allowed"),
        ("sqlite:///dir/", "absolute file path"),
        ("sqlite:///m.db?synchronous=off", "full or normal"),
        ("sqlite:///tmp/%00x.db", "NUL byte"),
    ],
)
def test_bad_sqlite_uris_say_what_is_wrong(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sqlite_uri(uri)


def test_a_bad_sqlite_uri_s_error_shows_no_password() -> None:
    with pytest.raises(ConfigError, match="host 'host' not allowed") as caught:
        parse_sqlite_uri("sqlite://user:s3cret@host/meta.db")
    assert "s3cret" not in str(caught.value)


def test_ledger_keys_sort_numerically() -> None:
    ids = [0, 1, 9, 10, 99, 1000, 2**63 - 1]
    keys = [ledger_key(ledger_id) for ledger_id in ids]
    assert sorted(keys) == keys
    assert [ledger_id_of(key) for key in keys] == ids


@pytest.mark.parametrize("ledger_id", [-1, 2**63, 2**64, "1", 1.5, True, None])
def test_a_ledger_key_of_no_ledger_id_is_an_invalid_argument(ledger_id: object) -> None:
    """A real check, not an assert (gone under python -O): out of range, not an int, a bool."""
    with pytest.raises(
        InvalidArgumentError, match=r"ledger id must be an int in \[0, 2\*\*63 - 1\]"
    ):
        ledger_key(ledger_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        check_ledger_id(ledger_id)


async def test_the_ledger_manager_refuses_a_bad_ledger_id_before_the_store(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'meta.db'}")
    ledgers = LedgerManager(store, LedgerIdGenerator(store))
    try:
        with pytest.raises(InvalidArgumentError, match="got -1"):
            await ledgers.get(-1)
        with pytest.raises(InvalidArgumentError, match="got 9223372036854775808"):
            await ledgers.delete(2**63)
        with pytest.raises(InvalidArgumentError, match=r"got 1\.5 \(float\)"):
            await ledgers.exists(1.5)  # type: ignore[arg-type]
    finally:
        await store.close()


def test_prefix_end_bounds_exactly_the_prefix() -> None:
    assert prefix_end("/p/") == "/p0"
    assert "/p/zzz" < prefix_end("/p/") <= "/p0"


def test_bookie_info_checks_its_fields() -> None:
    info = BookieInfo.for_address("10.1.2.3", 3181, shard_count=4)
    assert info.bookie_id == "10.1.2.3:3181" and info.rack == "/default-rack"
    with pytest.raises(InvalidMetadataError, match="port 0"):
        BookieInfo(bookie_id="x:0", host="x", port=0)
    with pytest.raises(InvalidMetadataError, match="no '/'"):
        BookieInfo(bookie_id="a/b", host="a", port=1)


def _registration(info: BookieInfo) -> KeyValue:
    key = registration_key(info.bookie_id, read_only=info.read_only)
    return KeyValue(key, encode_bookie_info(info), 1, 1, 0)


def test_a_registration_carries_journal_sync_off_and_reads_back() -> None:
    unsafe = BookieInfo.for_address("10.1.2.3", 3181, journal_sync=False, read_only=True)
    assert decode_bookie_info(_registration(unsafe)) == unsafe
    safe = BookieInfo.for_address("10.1.2.3", 3181)
    # The usual record is what it always was: clients that predate the field read it.
    assert "journal_sync" not in msgpack.unpackb(encode_bookie_info(safe))
    assert decode_bookie_info(_registration(safe)).journal_sync is True


def test_a_registration_with_a_newer_field_still_reads_but_not_a_broken_one() -> None:
    key = registration_key("10.1.2.3:3181", read_only=False)
    newer = msgpack.packb({"host": "10.1.2.3", "port": 3181, "from_the_future": 1})
    assert decode_bookie_info(KeyValue(key, newer, 1, 1, 0)).port == 3181
    for broken in (msgpack.packb([1, 2]), msgpack.packb({"host": "10.1.2.3"}), b"\xc1"):
        with pytest.raises(InvalidMetadataError, match="bookie registration"):
            decode_bookie_info(KeyValue(key, broken, 1, 1, 0))
