"""Journal files on disk: names, the file header, listing, creation and preallocation.

A journal directory holds `<16 hex digit file id>.jnl` files, ids ascending from 1, and a
`journal.lock` that one process holds while it writes there. A file starts with a 32-byte
header (big-endian):

    magic b"BKJN" | format version u16 | flags u16 | file id u64 | 12 zero bytes | crc32c u32

then records (records.py) back to back. A preallocated file is zeros after its last record.
Functions here block (file I/O): call them from the journal's threads, never from the loop.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import time
from pathlib import Path
from typing import Final

from crc32c import crc32c

from bkaio.journal.disk import Disk, write_all
from bkaio.journal.errors import JournalError, JournalFormatError

MAGIC: Final = b"BKJN"
FORMAT_VERSION: Final = 1
_HEADER_FIELDS: Final = struct.Struct(">4sHHQ12x")
_CRC: Final = struct.Struct(">I")
HEADER_BYTES: Final = _HEADER_FIELDS.size + _CRC.size
SUFFIX: Final = ".jnl"
PREALLOCATED_SUFFIX: Final = ".jnl.prealloc"
LOCK_NAME: Final = "journal.lock"
# Preallocation writes and syncs this much at a time: a sync waits for, and makes every other
# journal on the device wait behind, only this much instead of a whole file of zeros.
_ZERO_CHUNK: Final = bytes(256 * 1024)


def file_name(file_id: int) -> str:
    assert 0 < file_id < 1 << 64, file_id
    return f"{file_id:016x}{SUFFIX}"


def encode_header(file_id: int) -> bytes:
    fields = _HEADER_FIELDS.pack(MAGIC, FORMAT_VERSION, 0, file_id)
    return fields + _CRC.pack(crc32c(fields))


def header_problem(path: Path, header: bytes, file_id: int) -> str | None:
    """Why `header` is not a complete header (a torn file creation), or None when it is whole.

    Raises JournalFormatError when the header is complete but is not one this version writes:
    that is a foreign or newer file, which replay must not skip silently.
    """
    if len(header) < HEADER_BYTES:
        return f"file header incomplete: {len(header)} of {HEADER_BYTES} bytes"
    if header == bytes(HEADER_BYTES):
        return "file header is zeros"
    fields = header[: _HEADER_FIELDS.size]
    (stored_crc,) = _CRC.unpack_from(header, _HEADER_FIELDS.size)
    magic, version, _flags, stored_id = _HEADER_FIELDS.unpack(fields)
    if magic != MAGIC:
        raise JournalFormatError(f"{path}: magic {magic!r} is not a bkaio journal's {MAGIC!r}")
    if crc32c(fields) != stored_crc:
        raise JournalFormatError(f"{path}: file header checksum mismatch")
    if version != FORMAT_VERSION:
        raise JournalFormatError(
            f"{path}: journal format version {version}; this bkaio reads {FORMAT_VERSION}"
        )
    if stored_id != file_id:
        raise JournalFormatError(f"{path}: header names file id {stored_id}, not {file_id}")
    return None


def list_file_ids(directory: Path) -> list[int]:
    """Ids of the journal files in `directory`, ascending. Other names are ignored."""
    ids: list[int] = []
    for entry in os.scandir(directory):
        stem, dot, suffix = entry.name.partition(".")
        if dot and "." + suffix == SUFFIX and len(stem) == 16:
            try:
                ids.append(int(stem, 16))
            except ValueError:
                continue
    return sorted(ids)


def lock_directory(directory: Path) -> int:
    """Create `directory` if needed and take its exclusive lock; return the lock's fd."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise JournalError(f"journal directory {directory}: cannot open: {error}") from error
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(lock_fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise JournalError(
                f"journal directory {directory} is in use by another journal (lock held)"
            ) from None
        raise JournalError(f"journal directory {directory}: cannot lock: {error}") from error
    return lock_fd


def sync_directory(directory: Path) -> None:
    """Make a created, renamed or removed name in `directory` durable."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def create_file(directory: Path, file_id: int, *, sync: bool) -> int:
    """Create journal file `file_id` holding only its header; return an fd open for writing.

    With `sync`, the header and the new name are durable before this returns, so a crash can
    leave at most an empty or zero header in a file that never held a record.
    """
    path = directory / file_name(file_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, encode_header(file_id), 0)
        if sync:
            os.fdatasync(fd)
            sync_directory(directory)
    except BaseException:
        os.close(fd)
        raise
    return fd


def preallocated_path(directory: Path, file_id: int) -> Path:
    return directory / (f"{file_id:016x}" + PREALLOCATED_SUFFIX)


def preallocate_file(
    directory: Path, file_id: int, size_bytes: int, *, sync: bool, stop: list[bool], disk: Disk
) -> Path | None:
    """Write a whole future journal file aside: header, then zeros up to `size_bytes`.

    Runs on a background thread, never on the file being committed to. Its data goes through
    `disk` like the journal's own, so a fault-injecting disk fails or delays it too. Returns the
    prepared path, or None when `stop[0]` became true meanwhile; either way and when it raises
    (ENOSPC, EIO), a partial file is removed: it may hold up to `size_bytes` of a full disk.
    """
    path = preallocated_path(directory, file_id)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            disk.write(fd, encode_header(file_id), 0)
            offset = HEADER_BYTES
            while offset < size_bytes:
                if stop[0]:
                    break
                chunk = _ZERO_CHUNK[: size_bytes - offset]
                disk.write(fd, chunk, offset)
                offset += len(chunk)
                if sync:
                    disk.fdatasync(fd)
        finally:
            disk.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):  # The preparation's own error is the one to tell.
            path.unlink(missing_ok=True)
        raise
    if stop[0]:
        path.unlink(missing_ok=True)
        return None
    return path


# Deleting a released journal file frees its blocks a step at a time: on a file system mounted
# with online discard (ext4 -o discard, common on cloud disks) an unlink of 256 MiB makes the
# device discard it all at once, and every journal sync behind that discard waits for it
# (measured: 60-70 ms stalls unlinking 600 MB, at most 4 ms in 8 MiB steps).
DELETE_STEP_BYTES: Final = 8 * 1024 * 1024
DELETE_STEP_PAUSE_SECONDS: Final = 0.01


def delete_gradually(
    path: Path,
    *,
    sync: bool,
    step_bytes: int = DELETE_STEP_BYTES,
    pause_seconds: float = DELETE_STEP_PAUSE_SECONDS,
) -> None:
    """Unlink a journal file nobody needs any more, its blocks freed `step_bytes` at a time.

    Blocking (an executor thread). Each step truncates the file from the end and, with `sync`,
    fsyncs it, so the blocks it freed are committed (and discarded) on their own. The header is
    kept to the end: a crash midway leaves a valid, shorter file of records that replay no
    longer needs, and the next checkpoint deletes it again.
    """
    assert step_bytes > 0, step_bytes
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        while size - step_bytes > HEADER_BYTES:
            size -= step_bytes
            os.ftruncate(fd, size)
            if sync:
                os.fsync(fd)
            if pause_seconds > 0:
                time.sleep(pause_seconds)
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)


def install_preallocated(directory: Path, prepared: Path, file_id: int, *, sync: bool) -> int:
    """Rename a prepared file to journal file `file_id`; return an fd open for writing."""
    path = directory / file_name(file_id)
    os.rename(prepared, path)
    if sync:
        sync_directory(directory)
    return os.open(path, os.O_WRONLY | os.O_CLOEXEC)


def remove_stale_preallocated(directory: Path) -> None:
    """Drop prepared files a previous process left behind; they never held a record."""
    for entry in os.scandir(directory):
        if entry.name.endswith(PREALLOCATED_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
