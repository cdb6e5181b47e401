"""Entry digests and ledger master keys (docs/protocol.md, "Entries and digests", "Master key").

    digest     = crc32c( pack(">qqqq", ledger_id, entry_id, lac, length) || payload )
    master_key = HMAC-SHA256(key=sha256(b"bkaio-ledger\\0" + password),
                             msg=pack(">q", ledger_id))                    (32 bytes)

The writer computes the digest, the bookie checks it on add and the reader checks it again.
`length` is the ledger length after the entry (cumulative payload bytes), as in BookKeeper.
The master key is keyed by the ledger id, so one ledger's key says nothing about another's
(faults.md B4: a keyed hash, not a bare hash of the password). The password is hashed into
the HMAC key first because HMAC pads short keys with zeros ("pw" and "pw\\0" would collide).
Pure: imports crc32c, hashlib and hmac only (plus bkaio.errors for BadDigestError).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import TypeAlias

import crc32c

from bkaio import errors  # Module reference: see the import note in frames.py.

Payload: TypeAlias = bytes | bytearray | memoryview
_DIGEST_HEADER = struct.Struct(">qqqq")
_pack_header = _DIGEST_HEADER.pack
_crc32c = crc32c.crc32c
_MASTER_KEY_PREFIX = b"bkaio-ledger\0"
_LEDGER_ID = struct.Struct(">q")
MASTER_KEY_BYTES = 32


def entry_digest(ledger_id: int, entry_id: int, lac: int, length: int, payload: Payload) -> int:
    """CRC32C of the entry's ids, LAC and ledger length, then its payload (never copied)."""
    # Positional: a keyword argument costs the C call more than hashing a 1 KiB payload does.
    digest: int = _crc32c(payload, _crc32c(_pack_header(ledger_id, entry_id, lac, length)))
    return digest


def verify_entry_digest(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: Payload, digest: int
) -> bool:
    """Whether `digest` matches the entry: False means a corrupt or forged copy."""
    return entry_digest(ledger_id, entry_id, lac, length, payload) == digest


def check_entry_digest(
    ledger_id: int, entry_id: int, lac: int, length: int, payload: Payload, digest: int
) -> None:
    """Raise BadDigestError when `digest` does not match the entry."""
    actual = entry_digest(ledger_id, entry_id, lac, length, payload)
    if actual != digest:
        raise errors.BadDigestError(
            f"ledger {ledger_id}: entry {entry_id} (lac {lac}, length {length}, "
            f"{len(payload)}-byte payload) has digest {digest:#010x}, computed {actual:#010x}"
        )


def master_key(password: bytes, ledger_id: int) -> bytes:
    """The 32-byte key a ledger's writer and fencing readers send: HMAC-SHA256 of the ledger
    id under the ledger's password."""
    if not isinstance(password, bytes | bytearray | memoryview):
        raise errors.ConfigError(f"ledger password must be bytes, got {type(password).__name__}")
    if type(ledger_id) is not int or ledger_id < 0:
        raise errors.ConfigError(f"master key of ledger {ledger_id!r}: want an id >= 0")
    hmac_key = hashlib.sha256(_MASTER_KEY_PREFIX + bytes(password)).digest()
    return hmac.new(hmac_key, _LEDGER_ID.pack(ledger_id), hashlib.sha256).digest()


_PASSWORD_CHECK_PREFIX = b"bkaio-password-check\0"


def password_check(key: bytes) -> bytes:
    """What ledger metadata stores as `password_hash`: sha256 of the master key, so that reading
    metadata does not reveal the key; a bookie checks a presented key against it."""
    return hashlib.sha256(_PASSWORD_CHECK_PREFIX + bytes(key)).digest()
