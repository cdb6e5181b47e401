"""Names of namespaces, streams, cursors and bookies in metadata keys: a bad one is the caller's
argument (InvalidArgumentError saying which rule it breaks), not a corrupt record."""

from __future__ import annotations

import msgpack
import pytest

from bkaio.errors import InvalidArgumentError
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.records import CookieStore, NamespaceStore, _decode, check_name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("", "stream name must not be empty"),
        ("a/b", "stream name 'a/b' must not contain '/'"),
        ("x" * 256, "is 256 characters, more than 255"),
        ("tab\there", r"non-printable character '\\t' at index 3"),
        (7, r"stream name must be a str, not int \(7\)"),
        (None, "stream name must be a str, not NoneType"),
        (b"orders", "stream name must be a str, not bytes"),
    ],
)
def test_a_bad_name_is_an_argument_error_naming_the_rule(name: object, rule: str) -> None:
    with pytest.raises(InvalidArgumentError, match=rule) as raised:
        check_name("stream", name)
    assert not isinstance(raised.value, InvalidMetadataError)


def test_good_names_pass_and_long_names_are_shown_shortened() -> None:
    for name in ("orders", "x" * 255, "tenant-a.orders_2 (eu)", "überall"):
        check_name("stream", name)
    with pytest.raises(InvalidArgumentError) as raised:
        check_name("cursor", "y" * 10_000)
    assert len(str(raised.value)) < 120


def test_key_builders_refuse_bad_names_as_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="namespace name 'a/b'"):
        NamespaceStore.namespace_key("a/b")
    with pytest.raises(InvalidArgumentError, match="stream name must not be empty"):
        NamespaceStore.stream_key("tenant", "")
    with pytest.raises(InvalidArgumentError, match="bookie name must be a str"):
        CookieStore.key(3181)  # type: ignore[arg-type]
    assert NamespaceStore.stream_key("tenant", "orders") == "/streams/tenant/orders"


def test_a_record_that_reads_back_corrupt_is_still_invalid_metadata() -> None:
    with pytest.raises(InvalidMetadataError, match="is not a map"):
        _decode("/streams/t/s", msgpack.packb([1, 2]))
