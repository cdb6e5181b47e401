"""An etcd password in the metadata URI never reaches an error's text (docs/security.md)."""

from __future__ import annotations

import pytest

from bkaio.config.sections import MetadataSection
from bkaio.errors import ConfigError, MetadataError
from bkaio.meta import open_store
from bkaio.meta.etcd_connection import EtcdConnection
from bkaio.meta.uri import parse_etcd_uri
from bkaio.spark.errors import SparkOptionError
from bkaio.spark.options import parse_read_options

SECRET = "s3cr3t-etcd-pw"
URI = f"etcd://127.0.0.1:2379/bkaio?user=bkaio&password={SECRET}"


async def test_a_closed_etcd_connection_does_not_show_the_password() -> None:
    connection = EtcdConnection(URI, parse_etcd_uri(URI))
    await connection.close()

    async def never_called() -> None:
        raise AssertionError("a closed connection sent a request")

    with pytest.raises(MetadataError, match="is closed") as raised:
        await connection.retrying("get", never_called, idempotent=True)
    assert SECRET not in str(raised.value)
    assert "127.0.0.1:2379" in str(raised.value)


async def test_an_unknown_scheme_does_not_show_the_password() -> None:
    with pytest.raises(ConfigError, match="unknown scheme") as raised:
        await open_store(URI.replace("etcd://", "etcds://"))
    assert SECRET not in str(raised.value)


def test_a_uri_without_a_scheme_in_the_bookie_config_does_not_show_the_password() -> None:
    with pytest.raises(ConfigError, match="must be etcd://") as raised:
        MetadataSection(uri=URI.removeprefix("etcd://"))
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize("uri", [URI.removeprefix("etcd://"), f"bkaio:{SECRET}@127.0.0.1:2379/x"])
def test_a_uri_without_a_scheme_does_not_show_the_password_in_any_form(uri: str) -> None:
    # Credentials before the host were hidden only behind a scheme ("etcd://user:pw@host").
    with pytest.raises(ConfigError, match="must be etcd://") as raised:
        MetadataSection(uri=uri)
    assert SECRET not in str(raised.value)
    assert "127.0.0.1:2379" in str(raised.value)
    with pytest.raises(SparkOptionError, match="is not a URI") as spark_raised:
        parse_read_options({"metadata": uri, "stream": "ns/s"}, streaming=False)
    assert SECRET not in str(spark_raised.value)
