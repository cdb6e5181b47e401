"""Entry digests catch any flipped bit of what they cover; master keys are 32 distinct bytes."""

from __future__ import annotations

import hashlib
import hmac
import struct

import crc32c
import pytest

from bkaio.errors import BadDigestError, ConfigError
from bkaio.protocol import check_entry_digest, entry_digest, master_key, verify_entry_digest
from bkaio.protocol.digest import password_check

LEDGER_ID, ENTRY_ID, LAC, LENGTH = 12345, 678, 677, 1 << 20
PAYLOAD = bytes(range(256)) * 4 + b"tail"
DIGEST = entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD)


def test_digest_is_crc32c_of_the_packed_header_then_payload() -> None:
    header = struct.pack(">qqqq", LEDGER_ID, ENTRY_ID, LAC, LENGTH)
    assert crc32c.crc32c(header + PAYLOAD) == DIGEST
    assert 0 <= DIGEST < 2**32


def test_digest_accepts_a_memoryview_payload() -> None:
    assert entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, memoryview(PAYLOAD)) == DIGEST


def test_matching_digest_verifies() -> None:
    assert verify_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD, DIGEST)
    check_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD, DIGEST)


@pytest.mark.parametrize("bit", [0, 1, 7, 31, 62, 63])
@pytest.mark.parametrize("field", ["ledger_id", "entry_id", "lac", "length"])
def test_a_flipped_bit_in_each_header_field_is_detected(field: str, bit: int) -> None:
    values = {"ledger_id": LEDGER_ID, "entry_id": ENTRY_ID, "lac": LAC, "length": LENGTH}
    flipped = values[field] ^ (1 << bit)
    if flipped >= 2**63:
        flipped -= 2**64  # Same 64 bits, as the signed value ">q" packs.
    values[field] = flipped
    assert not verify_entry_digest(**values, payload=PAYLOAD, digest=DIGEST)
    with pytest.raises(BadDigestError, match=f"ledger {values['ledger_id']}: entry"):
        check_entry_digest(**values, payload=PAYLOAD, digest=DIGEST)


@pytest.mark.parametrize("position", [0, 1, 100, 511, 512, len(PAYLOAD) - 1])
@pytest.mark.parametrize("bit", [0, 3, 7])
def test_a_flipped_payload_bit_is_detected(position: int, bit: int) -> None:
    corrupt = bytearray(PAYLOAD)
    corrupt[position] ^= 1 << bit
    assert not verify_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, bytes(corrupt), DIGEST)


def test_every_payload_byte_position_is_covered() -> None:
    for position in range(0, len(PAYLOAD), 13):
        corrupt = bytearray(PAYLOAD)
        corrupt[position] ^= 0x80
        assert not verify_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, corrupt, DIGEST), position


def test_truncated_or_extended_payload_is_detected() -> None:
    assert not verify_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD[:-1], DIGEST)
    assert not verify_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD + b"\0", DIGEST)


def test_wrong_digest_value_is_detected() -> None:
    with pytest.raises(BadDigestError, match="computed"):
        check_entry_digest(LEDGER_ID, ENTRY_ID, LAC, LENGTH, PAYLOAD, DIGEST ^ 1)


def test_master_key_is_32_bytes_and_differs_per_password() -> None:
    passwords = [b"", b"a", b"b", b"secret", b"secret\0", b"\0secret"]
    keys = [master_key(password, 7) for password in passwords]
    assert all(len(key) == 32 for key in keys)
    assert len(set(keys)) == len(passwords)
    assert master_key(b"secret", 7) == master_key(b"secret", 7)
    hmac_key = hashlib.sha256(b"bkaio-ledger\0secret").digest()
    expected = hmac.new(hmac_key, (7).to_bytes(8, "big"), hashlib.sha256)
    assert master_key(b"secret", 7) == expected.digest()


def test_master_key_differs_per_ledger() -> None:
    """A key learned for one ledger is no use for another ledger with the same password."""
    keys = {master_key(b"secret", ledger_id) for ledger_id in (0, 1, 2, 255, 256, 2**62)}
    assert len(keys) == 6


def test_password_check_hashes_the_key() -> None:
    key = master_key(b"secret", 7)
    assert password_check(key) == hashlib.sha256(b"bkaio-password-check\0" + key).digest()
    assert password_check(key) != key


def test_master_key_refuses_a_str_password() -> None:
    with pytest.raises(ConfigError, match="must be bytes, got str"):
        master_key("secret", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("ledger_id", [-1, True, 1.0, "1"])
def test_master_key_refuses_a_bad_ledger_id(ledger_id: object) -> None:
    with pytest.raises(ConfigError, match="want an id >= 0"):
        master_key(b"secret", ledger_id)  # type: ignore[arg-type]
