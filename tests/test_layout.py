"""The package layout holds: no import circle, each layer imports only the layers below it, inside core/ and ui/ each
sub-package only itself and those below it (the order docs/architecture.md states), no huge module, no crowded folder.

Walks every `import` in `routerlab/` (module level and inside functions) with `ast`, so a lazy import
cannot hide a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "routerlab"
# What each layer may import from the library (besides itself). `ui` needs `tuning` for checkpoints;
# the load harness in `bench` drives the real app, so `bench` sits above `ui`.
ALLOWED = {
    "core": set(),
    "tuning": {"core"},
    "ui": {"core", "tuning"},
    "bench": {"core", "tuning", "ui"},
    "slides": {"core", "tuning", "ui", "bench"},  # the workshop's figures: the app's own plots, the benchmarks' machine line
}
MAX_LINES = 600
MOST_MODULES = 12  # modules directly in one folder
# Bottom to top: a sub-package imports its own modules and those of the sub-packages before it, never after.
CORE_ORDER = ("base", "kernels", "routing", "model", "graph", "ops", "records", "decode", "serve")
UI_ORDER = ("figures", "state", "web", "tabs")  # then ui/layout.py, which builds the page from them all


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Library modules `path` imports, resolved to module names (a name imported from a package counts
    as its submodule when one exists)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("routerlab"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("routerlab"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != me}


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}
GRAPH = {module_name(p): imports_of(p) for p in FILES}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_no_import_circle_inside_routerlab():
    # Package __init__ files only re-export; the facade `routerlab/__init__.py` and the CLI sit on top.
    graph = {m: {d for d in deps if d not in ("routerlab", "routerlab.__main__")} for m, deps in GRAPH.items()
             if m not in ("routerlab", "routerlab.__main__")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_each_layer_imports_only_the_layers_below_it():
    bad = []
    for m, deps in GRAPH.items():
        mine = layer(m)
        if mine is None:
            continue
        for d in deps:
            theirs = layer(d)
            if theirs is not None and theirs != mine and theirs not in ALLOWED[mine]:
                bad.append(f"{m} imports {d}")
    assert not bad, "layering broken:\n" + "\n".join(sorted(bad))


def _upward(package: str, order: tuple[str, ...]) -> list[str]:
    """Imports from a sub-package of routerlab.`package` to a later one, or to a module directly in `package`."""
    def rank(parts: list[str]) -> int:
        return order.index(parts[2]) if len(parts) > 2 and parts[2] in order else len(order)

    bad = []
    for m, deps in GRAPH.items():
        parts = m.split(".")
        if parts[:2] != ["routerlab", package] or rank(parts) == len(order):
            continue  # outside the package, or on top of its sub-packages
        bad += [f"{m} imports {d}" for d in deps if d.split(".")[:2] == ["routerlab", package] and rank(d.split(".")) > rank(parts)]
    return bad


def _stated_order(package: str) -> list[str]:
    import re

    drawn = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    found = re.search(rf"{package}/ sub-packages, bottom to top: (.*)", drawn)
    return [] if found is None else [x.strip(" `.") for x in found.group(1).split("<")]


def test_core_and_ui_sub_packages_import_only_downward_in_the_documented_order():
    core = PACKAGE / "core"
    assert sorted(p.name for p in core.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(CORE_ORDER)
    assert [p.name for p in core.glob("*.py")] == ["__init__.py"], "every core module sits in a sub-package"
    assert _stated_order("core") == list(CORE_ORDER) and _stated_order("ui") == [*UI_ORDER, "layout"]
    bad = _upward("core", CORE_ORDER) + _upward("ui", UI_ORDER)
    assert not bad, "an import runs up:\n" + "\n".join(sorted(bad))


def test_no_library_folder_holds_more_than_12_modules():
    crowded = {str(d.relative_to(PACKAGE.parent)): n for d in [PACKAGE, *PACKAGE.rglob("*")] if d.is_dir() and d.name != "__pycache__"
               and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MOST_MODULES}
    assert not crowded, crowded


def test_no_library_module_over_600_lines():
    long = {module_name(p): n for p in FILES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_walker_sees_lazy_imports():
    """The graph includes imports made inside functions (train imports evaluate lazily)."""
    assert "routerlab.tuning.evaluate" in GRAPH["routerlab.tuning.train"]
    assert "routerlab.core.model.models" in GRAPH["routerlab.tuning.evaluate"]


def test_every_event_of_the_generation_line_gives_it_the_same_limit():
    """Gradio lowers a line's concurrency limit to the lowest any of its events asks for, at that event's first push:
    one event of "gen" with a limit of 1 (the sweep once did) made every visitor's generation wait for the others."""
    from test_ui import tiny_resources

    from routerlab import ui

    res = tiny_resources()
    demo = ui.build_demo(res)
    limits = {}
    for fn in demo.fns.values():
        if fn.concurrency_id is not None and fn.concurrency_limit not in (None, "default"):
            limits.setdefault(fn.concurrency_id, set()).add(fn.concurrency_limit)
    assert limits["gen"] == {max(1, res.limits.concurrency)}, limits
    assert limits["lockstep"] == {1} and all(len(v) == 1 for v in limits.values()), limits
