"""Small CAS'd records: cookies, namespaces and streams. Driver-independent.

Cookies are opaque bytes (their format belongs to the bookie); namespace and stream records
are msgpack maps whose fields belong to `bkaio.stream`. Every write is a compare-and-swap on
the version the caller read (0: create if absent), and every versioned delete checks it; an
answer the store lost is resolved here by reading the record back (bkaio/meta/conditional.py),
so callers see success or MetadataVersionError, and MetadataOutcomeUnknownError only when the
store lost every answer of MAX_METADATA_ATTEMPTS copies (the last may still land).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from bkaio.errors import InvalidArgumentError
from bkaio.meta.conditional import compare_and_swap_resolved, delete_resolved
from bkaio.meta.errors import InvalidMetadataError
from bkaio.meta.store import MetadataStore

COOKIES_PREFIX = "/cookies/"
NAMESPACES_PREFIX = "/namespaces/"
STREAMS_PREFIX = "/streams/"


# A name is one segment of a metadata key (`/streams/<ns>/<stream>`): '/' would split it, and
# the limit keeps keys well inside etcd's and SQLite's key sizes.
NAME_MAX_CHARS = 255


def name_problem(kind: str, name: object) -> str | None:
    """Which rule `name` breaks as a `kind` name ("namespace", "stream", "cursor", "bookie"),
    as a sentence; None when it is a good name. The one statement of the rules: `check_name`
    and the stream layer's argument check both use it."""
    if not isinstance(name, str):
        return f"{kind} name must be a str, not {type(name).__name__} ({name!r:.40})"
    shown = repr(name) if len(name) <= 40 else f"{name[:40]!r}..."
    if not name:
        return f"{kind} name must not be empty"
    if len(name) > NAME_MAX_CHARS:
        return f"{kind} name {shown} is {len(name)} characters, more than {NAME_MAX_CHARS}"
    if "/" in name:
        return f"{kind} name {shown} must not contain '/'"
    for index, char in enumerate(name):
        if not char.isprintable():
            return f"{kind} name {shown} has a non-printable character {char!r} at index {index}"
    return None


def check_name(kind: str, name: object) -> None:
    """InvalidArgumentError saying which rule `name` breaks (`name_problem`), if it breaks one.

    A bad name is the caller's argument, not a corrupt record: InvalidMetadataError stays for
    records that read back broken."""
    problem = name_problem(kind, name)
    if problem is not None:
        raise InvalidArgumentError(problem)


@dataclass(frozen=True, slots=True)
class VersionedCookie:
    data: bytes
    version: int


class CookieStore:
    """`/cookies/<bookie_id>`: the metadata copy of a bookie's cookie (the source of truth)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    @staticmethod
    def key(bookie_id: str) -> str:
        check_name("bookie", bookie_id)
        return COOKIES_PREFIX + bookie_id

    async def get(self, bookie_id: str) -> VersionedCookie | None:
        kv = await self._store.get(self.key(bookie_id))
        return None if kv is None else VersionedCookie(kv.value, kv.version)

    async def put(self, bookie_id: str, data: bytes, *, expected_version: int) -> int:
        """Write if the stored cookie is at `expected_version` (0: none yet); the new version.
        MetadataVersionError otherwise."""
        return await compare_and_swap_resolved(
            self._store, self.key(bookie_id), data, expected_version=expected_version
        )

    async def delete(self, bookie_id: str, *, expected_version: int | None = None) -> bool:
        return await delete_resolved(
            self._store, self.key(bookie_id), expected_version=expected_version
        )


@dataclass(frozen=True, slots=True)
class VersionedRecord:
    name: str
    value: dict[str, Any]
    version: int


def _encode(value: dict[str, Any]) -> bytes:
    if not isinstance(value, dict):
        raise InvalidMetadataError(f"record must be a dict, not {type(value).__name__}")
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


def _decode(key: str, data: bytes) -> dict[str, Any]:
    try:
        value = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError) as error:
        raise InvalidMetadataError(f"record {key} does not decode: {error}") from None
    if not isinstance(value, dict):
        raise InvalidMetadataError(f"record {key} is not a map")
    return value


class NamespaceStore:
    """`/namespaces/<ns>` and `/streams/<ns>/<stream>`: plain CAS'd msgpack records."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store

    @staticmethod
    def namespace_key(namespace: str) -> str:
        check_name("namespace", namespace)
        return NAMESPACES_PREFIX + namespace

    @staticmethod
    def stream_key(namespace: str, stream: str) -> str:
        check_name("namespace", namespace)
        check_name("stream", stream)
        return f"{STREAMS_PREFIX}{namespace}/{stream}"

    async def _get(self, key: str, name: str) -> VersionedRecord | None:
        kv = await self._store.get(key)
        return None if kv is None else VersionedRecord(name, _decode(key, kv.value), kv.version)

    async def get_namespace(self, namespace: str) -> VersionedRecord | None:
        return await self._get(self.namespace_key(namespace), namespace)

    async def put_namespace(
        self, namespace: str, value: dict[str, Any], *, expected_version: int
    ) -> int:
        return await compare_and_swap_resolved(
            self._store,
            self.namespace_key(namespace),
            _encode(value),
            expected_version=expected_version,
        )

    async def delete_namespace(
        self, namespace: str, *, expected_version: int | None = None
    ) -> bool:
        return await delete_resolved(
            self._store, self.namespace_key(namespace), expected_version=expected_version
        )

    async def list_namespaces(self) -> list[str]:
        return [
            kv.key[len(NAMESPACES_PREFIX) :]
            async for kv in self._store.iterate_prefix(NAMESPACES_PREFIX, keys_only=True)
        ]

    async def get_stream(self, namespace: str, stream: str) -> VersionedRecord | None:
        return await self._get(self.stream_key(namespace, stream), stream)

    async def put_stream(
        self, namespace: str, stream: str, value: dict[str, Any], *, expected_version: int
    ) -> int:
        return await compare_and_swap_resolved(
            self._store,
            self.stream_key(namespace, stream),
            _encode(value),
            expected_version=expected_version,
        )

    async def delete_stream(
        self, namespace: str, stream: str, *, expected_version: int | None = None
    ) -> bool:
        return await delete_resolved(
            self._store, self.stream_key(namespace, stream), expected_version=expected_version
        )

    async def list_streams(self, namespace: str) -> list[str]:
        prefix = f"{STREAMS_PREFIX}{namespace}/"
        check_name("namespace", namespace)
        return [
            kv.key[len(prefix) :] async for kv in self._store.iterate_prefix(prefix, keys_only=True)
        ]
