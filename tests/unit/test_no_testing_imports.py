"""Production code never imports `bkaio.testing`: fault injection, mutations and fakes reach a
process only through its test entry points (`python -m bkaio.testing.bookie`), never because a
production module loaded them.

Every module of the `bkaio` package outside `bkaio/testing` is parsed; an `import`, a
`from ... import` (relative ones resolved) or a string that is exactly a `bkaio.testing` module
name (`importlib.import_module("bkaio.testing.disk")`, `-m bkaio.testing.bookie`) fails the test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bkaio

PACKAGE_ROOT = Path(bkaio.__file__).resolve().parent
TESTING = PACKAGE_ROOT / "testing"
_TESTING_NAME = re.compile(r"bkaio\.testing(\.[A-Za-z_]\w*)*")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_testing(name: str) -> bool:
    return name == "bkaio.testing" or name.startswith("bkaio.testing.")


def find_testing_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    """Where `source` (the text of module `module`) imports or names `bkaio.testing`."""
    found: list[str] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if _is_testing(alias.name)]
            found += [f"line {node.lineno}: import {name}" for name in names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            if any(_is_testing(target) for target in targets):
                found.append(f"line {node.lineno}: from {'.' * node.level}{node.module or ''}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _TESTING_NAME.fullmatch(node.value)
        ):
            found.append(f"line {node.lineno}: names module {node.value!r}")
    return found


def test_no_production_module_imports_bkaio_testing() -> None:
    offenders: list[str] = []
    modules = [p for p in PACKAGE_ROOT.rglob("*.py") if TESTING not in p.parents]
    assert len(modules) > 50, f"found only {len(modules)} modules under {PACKAGE_ROOT}"
    for path in modules:
        module = _module_name(path)
        for where in find_testing_imports(
            path.read_text(), module, is_package=path.name == "__init__.py"
        ):
            offenders.append(f"{path.relative_to(PACKAGE_ROOT.parent)} {where}")
    assert not offenders, "production modules import bkaio.testing:\n" + "\n".join(offenders)


def test_the_scan_sees_every_form_of_import() -> None:
    """The checker itself: each way of reaching bkaio.testing is caught, look-alikes are not."""
    caught = {
        "import bkaio.testing.disk": "bkaio.journal.disk",
        "from bkaio.testing.disk import FakeDisk": "bkaio.journal.disk",
        "from bkaio import testing": "bkaio.journal.disk",
        "from ..testing import disk": "bkaio.journal.disk",
        "importlib.import_module('bkaio.testing.disk')": "bkaio.journal.disk",
        "argv = ['-m', 'bkaio.testing.bookie']": "bkaio.bookie.parent",
    }
    results = {source: find_testing_imports(source, module) for source, module in caught.items()}
    missed = [source for source, found in results.items() if not found]
    assert not missed, missed
    assert find_testing_imports("from . import testing", "bkaio", is_package=True)
    clean = [
        "import bkaio.localproc",
        "from bkaio.journal import disk",
        "from . import test_switches",
        "message = 'start it with python -m bkaio.testing.bookie --disk lazy'",
        "name = 'bkaio.testing_notes'",
    ]
    assert not [s for s in clean if find_testing_imports(s, "bkaio.bookie.parent")]
