from __future__ import annotations

from pathlib import Path

import pytest

from bkaio.errors import ConfigError
from bkaio.journal import JournalConfig


def test_defaults_are_valid(tmp_path: Path) -> None:
    config = JournalConfig(directories=(tmp_path,))
    assert config.sync and config.adaptive_wait_us == 0 and not config.preallocate_next_file


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"directories": ()}, "non-empty"),
        ({"max_group_bytes": 0}, "max_group_bytes"),
        ({"max_group_bytes": 2048, "max_file_bytes": 1024}, "max_file_bytes"),
        ({"max_file_bytes": 100}, "at least"),
        ({"max_group_entries": 0}, "max_group_entries"),
        ({"adaptive_wait_us": -1}, "adaptive_wait_us"),
        ({"adaptive_wait_us": 1_000_000}, "adaptive_wait_us"),
    ],
)
def test_bad_values_are_refused(tmp_path: Path, overrides: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"directories": (tmp_path,), **overrides}
    with pytest.raises(ConfigError, match=message):
        JournalConfig(**arguments)  # type: ignore[arg-type]


def test_a_directory_named_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="twice"):
        JournalConfig(directories=(tmp_path, tmp_path / "." / ""))


def test_the_default_group_bound_fits_small_journal_files(tmp_path: Path) -> None:
    """Files smaller than the 4 MiB default group (as tests configure): the default follows
    them; a group bound set explicitly above the file size is still refused."""
    small = JournalConfig(directories=(tmp_path,), max_file_bytes=512 * 1024)
    assert small.max_group_bytes == 512 * 1024
    assert JournalConfig(directories=(tmp_path,)).max_group_bytes == 4 * 1024 * 1024
    with pytest.raises(ConfigError, match="max_file_bytes"):
        JournalConfig(directories=(tmp_path,), max_group_bytes=2048, max_file_bytes=1024)
