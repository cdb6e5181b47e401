"""No import cycle inside bkaio/: a module never imports (even for type checking, even inside a
function) a module that imports it back, directly or through others.

The graph is grimp's (every import statement of the package, `if TYPE_CHECKING:` blocks
included). A cycle is a strongly connected component of more than one module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grimp

# Cycles tolerated until they are broken (none now: the last one, bookie/admin.py <->
# bookie/parent.py, went when admin took what it needs from the parent as arguments).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


def _cycles(imports: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in imports:
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(imports.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, todo = work[-1]
            if todo:
                target = todo.pop()
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, sorted(imports.get(target, ()))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _bkaio_imports() -> dict[str, set[str]]:
    graph = grimp.build_graph("bkaio", cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def test_the_cycle_finder_finds_cycles_and_only_cycles() -> None:
    imports = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert _cycles(imports) == [frozenset({"a", "b", "c"})]


def test_no_import_cycle_inside_bkaio_but_the_known_one() -> None:
    cycles = _cycles(_bkaio_imports())
    new = [sorted(cycle) for cycle in cycles if not any(cycle <= known for known in KNOWN_CYCLES)]
    assert new == [], f"import cycles inside bkaio/: {new}"


# Ledger storage reaches the journal only through `bkaio.wal` (the write-ahead log's interface,
# below both); what it still imports from the journal package are the seams of the `seams` work
# (issue 23), the Disk and the crash points, which are to move below both with it.
ENTRYLOG_MAY_IMPORT_FROM_JOURNAL = frozenset({"bkaio.journal.disk", "bkaio.journal.crash_points"})


def test_ledger_storage_does_not_import_the_journal() -> None:
    imports = _bkaio_imports()
    reached = {
        f"{module} -> {target}"
        for module, targets in imports.items()
        if module.startswith("bkaio.entrylog")
        for target in targets
        if (target == "bkaio.journal" or target.startswith("bkaio.journal."))
        and target not in ENTRYLOG_MAY_IMPORT_FROM_JOURNAL
    }
    assert reached == set()


def _reaches(imports: dict[str, set[str]], importer: str, imported: str) -> set[str]:
    """The imports of modules of package `importer` into package `imported`."""

    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return {
        f"{module} -> {target}"
        for module, targets in imports.items()
        if inside(module, importer)
        for target in targets
        if inside(target, imported)
    }


def test_the_layers_import_only_downwards() -> None:
    """The codec knows no storage, journal, client or bookie; storage and the journal know no
    codec and no metadata (docs/architecture.md)."""
    imports = _bkaio_imports()
    forbidden = [
        ("bkaio.protocol", "bkaio.entrylog"),
        ("bkaio.protocol", "bkaio.journal"),
        ("bkaio.protocol", "bkaio.ledger_client"),
        ("bkaio.protocol", "bkaio.bookie"),
        ("bkaio.entrylog", "bkaio.protocol"),
        ("bkaio.entrylog", "bkaio.meta"),
        ("bkaio.journal", "bkaio.protocol"),
        ("bkaio.journal", "bkaio.meta"),
        ("bkaio.journal", "bkaio.entrylog"),
        ("bkaio.wal", "bkaio.journal"),
        ("bkaio.wal", "bkaio.entrylog"),
        ("bkaio.ledger_client", "bkaio.stream"),
        ("bkaio.errors", "bkaio.protocol"),
    ]
    found = sorted(edge for a, b in forbidden for edge in _reaches(imports, a, b))
    assert found == []
