"""Decoding the bookie configuration: parsed TOML and `BKAIO_<SECTION>_<KEY>` environment
overrides into typed values, section by section.

Typing is msgspec's: the file is converted (strictly: `enabled = 1` is not a boolean) into one
struct per section whose fields are the dataclasses' own fields and types, environment values
leniently (strings to numbers and booleans). This module only shapes the input (comma lists,
yes/no) and words msgspec's errors with the file or variable, the key and the value. An unknown
section or key, in the file or in a `BKAIO_<SECTION>_` variable of a known section, is a
`ConfigError` naming it, and so is a float that is not finite (TOML's `nan` and `inf`, or the
same in a variable): no key means anything by them.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from bkaio.config.sections import (
    AdminConfig,
    AutorecoveryConfig,
    BookieSection,
    GcConfig,
    LogConfig,
    MetadataSection,
    ReadOnlyConfig,
    ScrubConfig,
    ServerConfig,
    StorageDirs,
    TlsConfig,
)
from bkaio.entrylog.config import StorageConfig
from bkaio.env_names import COMMAND_LINE_ONLY
from bkaio.errors import ConfigError
from bkaio.journal import JournalConfig

ENV_PREFIX = "BKAIO_"


# The TOML sections that map 1:1 onto a dataclass (the journal and storage ones are merged).
_SECTIONS: dict[str, type[Any]] = {
    "bookie": BookieSection,
    "metadata": MetadataSection,
    "server": ServerConfig,
    "admin": AdminConfig,
    "read_only": ReadOnlyConfig,
    "log": LogConfig,
    "autorecovery": AutorecoveryConfig,
    "gc": GcConfig,
    "tls": TlsConfig,
    "scrub": ScrubConfig,
}
# Keys of StorageConfig/JournalConfig the bookie sets itself (directories, disk thresholds).
_STORAGE_OWN_KEYS = frozenset(
    {
        "journal",
        "ledger_dirs",
        "index_dirs",
        "disk_warn_fraction",
        "disk_read_only_fraction",
        "ledger_stride",
    }
)
_JOURNAL_DIR_KEYS = frozenset({"directory", "directories", "journal_dir", "journal_dirs"})


def settable_fields(cls: type[Any], excluded: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Field name -> resolved type hint of the init fields of dataclass `cls`."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and f.name not in excluded
    }


def _all_sections() -> dict[str, dict[str, Any]]:
    sections = {name: settable_fields(cls) for name, cls in _SECTIONS.items()}
    storage = settable_fields(StorageDirs)
    storage.update(settable_fields(StorageConfig, _STORAGE_OWN_KEYS))
    sections["storage"] = storage
    sections["journal"] = settable_fields(JournalConfig, _JOURNAL_DIR_KEYS)
    return sections


# --- msgspec does the typing; this module only names what went wrong -------------------------

_SECTION_HINTS = _all_sections()
# The shape of a config file for msgspec: one struct per section whose fields are the section's
# keys, every one optional (UNSET: not in the file). Unknown sections and keys are refused.
_FILE_TYPE = msgspec.defstruct(
    "BookieConfigFile",
    [
        (
            section,
            msgspec.defstruct(
                f"{section}_section",
                [(key, hint, msgspec.UNSET) for key, hint in hints.items()],
                kw_only=True,
                forbid_unknown_fields=True,
            ),
            msgspec.UNSET,
        )
        for section, hints in _SECTION_HINTS.items()
    ],
    kw_only=True,
    forbid_unknown_fields=True,
)
# msgspec's type names in its errors, as this project words them.
_EXPECTED = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true/false)",
    "str": "a string",
    "array": "a list",
    "object": "a table",
}
_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")
_EXPECTED_TYPE = re.compile(r"Expected `(?P<type>[^`|]*)[^`]*`, got `[^`]*`")
_PATH_PART = re.compile(r"\.(?P<name>\w+)|\[(?P<index>\d+)\]")


def _decode_path(hint: type, value: object) -> object:
    """msgspec's hook for the one type it does not know: a path, from a non-empty string."""
    if hint is Path:
        if isinstance(value, str) and value:
            return Path(value).expanduser()
        raise ValueError("must be a non-empty path string")
    raise NotImplementedError(hint)


def _config_error(where: str, error: msgspec.ValidationError, data: object) -> ConfigError:
    """`error` as a ConfigError naming the file (or variable), the key and the bad value."""
    match = _ERROR.match(str(error))
    assert match is not None
    what, path = match["what"], match["path"] or ""
    parts = [
        m["name"] if m["name"] is not None else int(m["index"]) for m in _PATH_PART.finditer(path)
    ]
    unknown = _UNKNOWN_FIELD.match(what)
    if unknown is not None and not parts:
        return ConfigError(
            f"{where}: unknown section [{unknown['key']}]; "
            f"known: {', '.join(sorted(_SECTION_HINTS))}"
        )
    if unknown is not None:
        section = str(parts[0])
        return ConfigError(
            f"{where}: unknown key {section}.{unknown['key']}; known keys of [{section}]: "
            f"{', '.join(sorted(_SECTION_HINTS[section]))}"
        )
    value: Any = data
    for part in parts:
        value = value[part]
    key = "".join(f".{p}" if isinstance(p, str) else f"[{p}]" for p in parts).lstrip(".")
    expected = _EXPECTED_TYPE.match(what)
    reason = f"must be {_EXPECTED.get(expected['type'], expected['type'])}" if expected else what
    if len(parts) == 1:
        return ConfigError(f"{where}: {key} must be a table ([{key}])")
    return ConfigError(f"{where}: {key}={value!r} {reason}")


def _not_finite(value: object) -> bool:
    """NaN fails every comparison, so a range check such as `x <= 0` lets it through; and no
    key takes infinity (a thing that can be off is off at 0 or through a boolean). Refused here,
    once, for every float key of the file and the environment."""
    return isinstance(value, float) and not math.isfinite(value)


def _decode_file(data: Mapping[str, Any], origin: str) -> dict[str, dict[str, Any]]:
    """The file's values by section and key, each of its field's type (msgspec, strict)."""
    shaped = {
        section: {
            key: [value] if isinstance(value, str) and _is_tuple(section, key) else value
            for key, value in table.items()
        }
        if isinstance(table, dict)
        else table
        for section, table in data.items()
    }  # A single string where a list is wanted is a list of one.
    try:
        decoded = msgspec.convert(shaped, _FILE_TYPE, dec_hook=_decode_path)
    except msgspec.ValidationError as error:
        raise _config_error(origin, error, shaped) from None
    merged: dict[str, dict[str, Any]] = {}
    for section in _SECTION_HINTS:
        table = getattr(decoded, section)
        merged[section] = {} if table is msgspec.UNSET else {
            key: getattr(table, key)
            for key in _SECTION_HINTS[section]
            if getattr(table, key) is not msgspec.UNSET
        }  # fmt: skip
        for key, value in merged[section].items():
            if _not_finite(value):
                raise ConfigError(f"{origin}: {section}.{key}={value!r} must be a finite number")
    return merged


def _is_tuple(section: str, key: str) -> bool:
    hint = _SECTION_HINTS.get(section, {}).get(key)
    return typing.get_origin(hint) is tuple


def _decode_env_value(variable: str, hint: Any, text: str) -> Any:
    """One `BKAIO_<SECTION>_<KEY>` value as its field's type: msgspec in lax mode (strings to
    numbers and booleans), after the spellings environments use (comma lists, yes/no, none)."""
    value: Any = text.strip()
    optional = typing.get_origin(hint) in (types.UnionType, typing.Union)
    if optional and value.lower() in {"", "none"}:
        return None
    inner = (
        next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    )
    if typing.get_origin(inner) is tuple:
        value = [item.strip() for item in value.split(",") if item.strip()]
    elif inner is bool:
        value = _ENV_BOOLEANS.get(value.lower(), value)
    elif inner is int:
        value = value.replace("_", "")
    try:
        decoded = msgspec.convert(value, hint, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as error:
        match = _EXPECTED_TYPE.match(_ERROR.match(str(error))["what"])  # type: ignore[index]
        reason = f"must be {_EXPECTED.get(match['type'], match['type'])}" if match else str(error)
        raise ConfigError(f"environment {variable}={text!r} {reason}") from None
    if _not_finite(decoded):
        raise ConfigError(f"environment {variable}={text!r} must be a finite number")
    return decoded


_ENV_BOOLEANS = {"yes": "true", "on": "true", "no": "false", "off": "false"}


def merge_sources(
    data: Mapping[str, Any], env: Mapping[str, str], origin: str
) -> dict[str, dict[str, Any]]:
    """Every section's typed values: the file's, then the environment's over them."""
    merged = _decode_file(data, origin)
    # Longest section name first, so BKAIO_READ_ONLY_X is never read as section "read".
    by_length = sorted(_SECTION_HINTS, key=len, reverse=True)
    for variable, value in env.items():
        if not variable.startswith(ENV_PREFIX) or variable in COMMAND_LINE_ONLY:
            continue
        rest = variable[len(ENV_PREFIX) :].lower()
        for section_name in by_length:
            if rest.startswith(section_name + "_"):
                key = rest[len(section_name) + 1 :]
                hints = _SECTION_HINTS[section_name]
                if key not in hints:
                    raise ConfigError(
                        f"environment: {variable} names unknown key {section_name}.{key}; known "
                        f"keys of [{section_name}]: {', '.join(sorted(hints))}"
                    )
                merged[section_name][key] = _decode_env_value(variable, hints[key], value)
                break
    return merged
