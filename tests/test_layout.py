"""The package layout holds: no import circle, each layer imports only the layers below it, no huge module.

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
