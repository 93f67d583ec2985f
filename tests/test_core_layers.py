"""The library's layout: core/ and ui/ as sub-packages stacked in one order each, every import (at the top of a module
or inside a function) going to the same sub-package or one below it, no import cycle among modules, and no folder of
the library holding more than 12 modules directly. docs/architecture.md draws the same orders."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "routerlab"
CORE = LIB / "core"
# bottom to top: a sub-package may import its own modules and those of the sub-packages before it, never after
ORDER = ("base", "kernels", "routing", "model", "graph", "ops", "records", "decode", "serve")
UI_ORDER = ("figures", "state", "web", "tabs")  # then ui/layout.py, which builds the page from them all
MOST_MODULES = 12


def _imports(path: Path) -> set[str]:
    """Every routerlab module `path` imports, at its top or inside functions (dotted names)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("routerlab"):
            for a in node.names:  # `from routerlab.core.serve import room` imports the module room
                sub = f"{node.module}.{a.name}"
                out.add(sub if _module_path(sub) is not None else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("routerlab"))
    return out


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _core_modules() -> dict[str, Path]:
    return {_name(p): p for p in CORE.rglob("*.py") if "__pycache__" not in p.parts}


def test_core_is_sub_packages_in_the_documented_order_and_nothing_else():
    assert sorted(p.name for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ORDER)
    assert [p.name for p in CORE.glob("*.py")] == ["__init__.py"], "every core module sits in a sub-package"
    drawn = (ROOT / "docs" / "architecture.md").read_text()
    order = re.search(r"core/ sub-packages, bottom to top: (.*)", drawn)
    assert order is not None and [s.strip(" `.") for s in order.group(1).split("<")] == list(ORDER), \
        "docs/architecture.md states the same order"


def test_every_core_import_goes_to_its_own_sub_package_or_one_below():
    up = []
    for name, path in _core_modules().items():
        parts = name.split(".")
        if len(parts) < 3:
            continue
        mine = ORDER.index(parts[2])
        for target in _imports(path):
            t = target.split(".")
            if t[:2] == ["routerlab", "core"] and len(t) > 2 and ORDER.index(t[2]) > mine:
                up.append(f"{name} -> {target}")
            elif t[:2] == ["routerlab", "core"] and len(t) == 2:
                up.append(f"{name} -> routerlab.core (import from the sub-package)")
            elif t[:2] != ["routerlab", "core"]:
                up.append(f"{name} -> {target} (core knows nothing of the rest of routerlab)")
    assert not up, "\n".join(sorted(up))


def test_no_import_cycle_among_the_library_modules():
    modules = {_name(p): p for p in LIB.rglob("*.py") if "__pycache__" not in p.parts}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _imports(path):
            t = target
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + ".") and not (path.name == "__init__.py"):
                deps.add(t)
        graph[name] = deps
    seen, stack, cycles = {}, [], []

    def visit(n):
        seen[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if seen.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in seen:
                visit(d)
        stack.pop()
        seen[n] = 2

    for n in sorted(graph):
        if n not in seen:
            visit(n)
    assert not cycles, "\n".join(cycles)


def test_no_library_folder_holds_more_than_12_modules():
    crowded = {str(d.relative_to(ROOT)): n for d in [LIB, *LIB.rglob("*")] if d.is_dir() and d.name != "__pycache__"
               and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MOST_MODULES}
    assert not crowded, crowded


def test_every_ui_import_goes_to_its_own_sub_package_or_one_below():
    up = []
    for path in (LIB / "ui").rglob("*.py"):
        parts = path.relative_to(LIB / "ui").parts
        if len(parts) < 2 or "__pycache__" in parts:
            continue  # ui/layout.py and ui/__init__.py sit on top
        mine = UI_ORDER.index(parts[0])
        for target in _imports(path):
            t = target.split(".")
            if t[:2] == ["routerlab", "ui"] and (len(t) == 2 or t[2] not in UI_ORDER or UI_ORDER.index(t[2]) > mine):
                up.append(f"{_name(path)} -> {target}")
    assert not up, "\n".join(sorted(up))
    drawn = (ROOT / "docs" / "architecture.md").read_text()
    order = re.search(r"ui/ sub-packages, bottom to top: (.*)", drawn)
    assert order is not None and [s.strip(" `.") for s in order.group(1).split("<")] == [*UI_ORDER, "layout"]
