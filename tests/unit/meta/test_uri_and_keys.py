"""Metadata URIs, key layout helpers and BookieInfo checks: pure functions."""

from __future__ import annotations

import msgpack
import pytest

from bkaio.errors import ConfigError
from bkaio.meta.bookies import (
    BookieInfo,
    decode_bookie_info,
    encode_bookie_info,
    registration_key,
)
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.ledgers import ledger_id_of, ledger_key
from bkaio.meta.store import KeyValue, prefix_end
from bkaio.meta.uri import parse_etcd_uri, parse_sqlite_uri


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
        ("etcd://host:1/p?timeout=-1", "must be > 0"),
    ],
)
def test_bad_etcd_uris_say_what_is_wrong(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_etcd_uri(uri)


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
    ],
)
def test_bad_sqlite_uris_say_what_is_wrong(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sqlite_uri(uri)


def test_ledger_keys_sort_numerically() -> None:
    ids = [0, 1, 9, 10, 99, 1000, 2**63 - 1]
    keys = [ledger_key(ledger_id) for ledger_id in ids]
    assert sorted(keys) == keys
    assert [ledger_id_of(key) for key in keys] == ids


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
