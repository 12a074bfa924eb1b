"""The import graph of the package: no circle between modules (imports inside functions included), and
layers that point one way (the layers of ``verispec/__init__.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layers, lowest first: a module may import modules of its own layer or of lower ones only. The first
#: part of a module's name below ``verispec`` decides its layer (a package's ``cli`` module: the edge).
LAYERS = [
    {"checks", "params", "topk", "sets", "sampling", "settings", "runtime", "tree_nodes", "outputs"},   # plain helpers
    {"rules"},                       # pure tensor maths: probabilities + drafts -> verdicts, closed forms
    {"models"},                      # backends
    {"engine"},                      # decoding loops
    {"tasks", "cluster"},            # datasets, prompts, checkers, the sandbox; a pool of Ray workers
    {"diagnose"},                    # per-token distortion on real positions
    {"bench"},                       # runs, store, reports
    {"flags", "demo", "commands", "serve", "integrations", "cli", "__main__", ""},   # the edge ("": the package itself)
]
#: Within one layer, packages that may not import each other (each stands alone).
SEPARATE = [{"tasks", "cluster"}, {"serve", "integrations"}]


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "verispec").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every verispec module ``name`` imports, anywhere in the file (a package counts as its __init__,
    and importing ``a.b.c`` also runs ``a.b``)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] != "verispec":
                continue
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            parts = target.split(".")
            for i in range(2, len(parts) + 1):
                found.add(".".join(parts[:i]))
    found.discard(name)
    return {m for m in found if m in modules and not name.startswith(m + ".")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(module: str) -> int:
    if module.endswith(".cli"):     # a package's own command-line glue belongs to the edge
        return len(LAYERS) - 1
    part = _part(module)
    for i, layer in enumerate(LAYERS):
        if part in layer:
            return i
    raise AssertionError(f"{module}: no layer for {part!r}; add it to LAYERS in tests/test_imports.py")


def test_the_graph_is_read():
    modules = _modules()
    assert "verispec.engine.generate" in modules and "verispec.rules.base" in modules
    deps = _imports("verispec.engine.generate", modules["verispec.engine.generate"], modules)
    assert {"verispec.rules", "verispec.rules.tree", "verispec.engine.config"} <= deps


def test_no_import_circles(graph):
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_layers_point_one_way(graph):
    wrong = []
    for module, deps in graph.items():
        for dep in deps:
            if _layer(dep) > _layer(module):
                wrong.append(f"{module} -> {dep}")
            elif _part(dep) != _part(module) and any({_part(dep), _part(module)} <= s for s in SEPARATE):
                wrong.append(f"{module} -> {dep} (separate packages)")
    assert wrong == []
