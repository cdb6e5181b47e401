"""A cluster's identity in its metadata store: the layout version and the instance id.

A metadata store holds a bkaio cluster only once `initialise_cluster` has written `/layout` and
`/instanceid`. Everything else (clients, the shell, bookies, autorecovery) goes through
`open_metadata`, which calls `require_initialised` and refuses a store without them. So a
mistyped `sqlite://` path or a wrong etcd prefix is an error that names the URI and says how to
create a cluster, instead of a new, empty cluster nobody meant to make. Only `bkaio standalone`
and the shell's `metaformat` / `initnewcluster` call `initialise_cluster`.

Knows only the `MetadataStore` interface; no driver, no ledgers.
"""

from __future__ import annotations

import uuid

from bkaio.errors import BKError, ConfigError, MetadataVersionError
from bkaio.meta.conditional import compare_and_swap_resolved
from bkaio.meta.store import MAX_METADATA_ATTEMPTS, MetadataStore, metadata_attempts_exhausted
from bkaio.meta.uri import shown_uri

LAYOUT_KEY = "/layout"
LAYOUT_VERSION = b"1"
INSTANCE_ID_KEY = "/instanceid"


def _where(store: MetadataStore) -> str:
    """The store's URI as given, less credentials (its query also holds `prefix=`)."""
    return shown_uri(store.uri)


HOW_TO_INITIALISE = (
    "create a cluster with `bkaio shell initnewcluster --metadata URI` (or let "
    "`bkaio standalone` create one), or fix the URI if it names the wrong store"
)


class ClusterNotInitialisedError(ConfigError):
    """The metadata store holds no bkaio cluster (no layout or instance id)."""


class ClusterExistsError(BKError):
    """`initialise_cluster` found a cluster already there (and was not told that is fine)."""


async def read_instance_id(store: MetadataStore) -> str | None:
    """The cluster's instance id, or None when the store holds no initialised cluster.

    ConfigError when the store holds a layout this build does not understand.
    """
    layout = await store.get(LAYOUT_KEY)
    if layout is None:
        return None
    if layout.value != LAYOUT_VERSION:
        raise ConfigError(
            f"metadata at {_where(store)}: layout version {layout.value!r} is not "
            f"{LAYOUT_VERSION!r}; this build of bkaio cannot use it"
        )
    instance = await store.get(INSTANCE_ID_KEY)
    return None if instance is None else instance.value.decode()


async def require_initialised(store: MetadataStore) -> str:
    """The cluster's instance id; ClusterNotInitialisedError when there is none."""
    instance_id = await read_instance_id(store)
    if instance_id is None:
        raise ClusterNotInitialisedError(
            f"no bkaio cluster at metadata {_where(store)}: {HOW_TO_INITIALISE}"
        )
    return instance_id


async def _create_if_absent(store: MetadataStore, key: str, value: bytes) -> tuple[bytes, bool]:
    """The value of `key`, writing `value` first if the key does not exist yet; and whether this
    call wrote it (a lost answer is resolved by reading the key back: our value there counts
    as ours). At most MAX_METADATA_ATTEMPTS creations, then MetadataError (the key still
    absent), or MetadataOutcomeUnknownError when the store lost every answer.
    """
    for _attempt in range(MAX_METADATA_ATTEMPTS):
        kv = await store.get(key)
        if kv is not None:
            return kv.value, False
        try:
            await compare_and_swap_resolved(store, key, value, expected_version=0)
        except MetadataVersionError:
            continue  # Someone else created it first: read what is there.
        return value, True
    raise metadata_attempts_exhausted(f"metadata key {key}", "creating it")


async def initialise_cluster(
    store: MetadataStore, *, exist_ok: bool = False, instance_id: str | None = None
) -> str:
    """Make the store hold a cluster: write the layout version and an instance id.

    Returns the instance id. An already initialised store raises ClusterExistsError, unless
    `exist_ok`, in which case its instance id is returned and nothing is written. Safe against
    concurrent callers: each key is created only if absent, so all of them agree on one id.
    `instance_id` (hex) replaces the random one (for tools that recreate a known cluster).
    """
    existing = await read_instance_id(store)
    if existing is not None:
        if exist_ok:
            return existing
        raise ClusterExistsError(
            f"metadata at {_where(store)} already holds cluster {existing}; "
            "use `bkaio shell nukeexistingcluster` first to start over"
        )
    # The layout goes last: a store with an instance id but no layout still counts as empty,
    # so a crash between the two writes leaves a store that initialise_cluster finishes (with
    # the id already there). Whoever writes the layout is the one that initialised the cluster.
    new_id = instance_id if instance_id is not None else uuid.uuid4().hex
    chosen, _ = await _create_if_absent(store, INSTANCE_ID_KEY, new_id.encode())
    layout, wrote_layout = await _create_if_absent(store, LAYOUT_KEY, LAYOUT_VERSION)
    if layout != LAYOUT_VERSION:
        raise ConfigError(
            f"metadata at {_where(store)}: layout version {layout!r} is not "
            f"{LAYOUT_VERSION!r}; this build of bkaio cannot use it"
        )
    if not wrote_layout and not exist_ok:
        raise ClusterExistsError(
            f"metadata at {_where(store)}: another process initialised cluster "
            f"{chosen.decode()} at the same time"
        )
    return chosen.decode()
