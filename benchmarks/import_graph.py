"""The package's import graph: floors, cycles, function-local imports, largest files.

    python benchmarks/import_graph.py [PACKAGE_DIR]     (default: reslm/ beside this folder)

Reads the source with `ast` (nothing is imported). A module's edges are its reslm-internal imports at
module level, to the module whose names it takes (`import reslm.x`, `from reslm.x import y`: reslm.x,
or reslm.x.y where y is a module; the package __init__ that Python runs on the way is not counted,
as a submodule may import a sibling without its package's names). A module's floor
is 1 + the highest floor among the modules it imports (a module importing nothing of reslm is floor
1); the package's floors are the highest floor, with one longest chain printed. The same is printed
for the layers: each subpackage (reslm/data, reslm/models, ...) counted as one unit, each top-level
module as its own; an import between two modules of one subpackage is inside its layer. A cycle
between layers (a subpackage and a module importing each other) is listed too. Imports inside a
function body are listed apart (they hide an edge from the graph); cycles are strongly connected
components of more than one module.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_package(root: Path) -> tuple[dict[str, Path], dict[str, set[str]], list[tuple[str, int, str]]]:
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    edges: dict[str, set[str]] = {m: set() for m in files}
    local: list[tuple[str, int, str]] = []
    pkg = root.name

    def targets(node) -> list[str]:
        """The modules whose names the statement takes: `from P import m` (m a module) -> P.m, else P."""
        if isinstance(node, ast.Import):
            return [a.name for a in node.names if a.name.split(".")[0] == pkg]
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.split(".")[0] == pkg:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files]
            return subs + ([node.module] if len(subs) < len(node.names) else [])
        return []

    for mod, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    in_function.add(id(node))
        for node in ast.walk(tree):
            for t in targets(node):
                if id(node) in in_function:
                    local.append((mod, node.lineno, t))
                    continue
                if t in files and t != mod:
                    edges[mod].add(t)
    return files, edges, local


def sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def floors(edges: dict[str, set[str]]) -> tuple[dict[str, int], dict[str, str | None]]:
    floor, via = {}, {}

    def f(v, seen=()):
        if v in floor:
            return floor[v]
        if v in seen:  # a cycle: cut it here
            return 0
        best, arg = 0, None
        for w in edges[v]:
            h = f(w, seen + (v,))
            if h > best:
                best, arg = h, w
        floor[v], via[v] = best + 1, arg
        return floor[v]

    for v in edges:
        f(v)
    return floor, via


def layer_edges(edges: dict[str, set[str]], root: Path) -> dict[str, set[str]]:
    """The graph with each subpackage of `root` as one node (its modules' edges, minus internal ones)."""
    def unit(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and (root / parts[1]).is_dir() else m
    out: dict[str, set[str]] = {}
    for m, ts in edges.items():
        out.setdefault(unit(m), set()).update(unit(t) for t in ts if unit(t) != unit(m))
    return out


def longest_chain(floor: dict[str, int], via: dict[str, str | None]) -> list[str]:
    """The chain of imports down from the highest module (ties: the last name)."""
    chain, v = [], max(floor, key=lambda m: (floor[m], m))
    while v is not None:
        chain.append(v)
        v = via[v]
    return chain


def print_graph(what: str, edges: dict[str, set[str]], extra: str = "") -> dict[str, int]:
    """One line of floors with the longest chain, one of cycles; returns the floors."""
    floor, via = floors(edges)
    chain = longest_chain(floor, via)
    cycles = [c for c in sccs(edges) if len(c) > 1]
    print(f"{what}: {len(edges)}{extra}, floors: {floor[chain[0]]}  longest chain: {' -> '.join(chain)}")
    print(f"{what} cycles: {len(cycles)}" + "".join(f"\n  {' <-> '.join(sorted(c))}" for c in cycles))
    return floor


def print_by_floor(floor: dict[str, int]) -> None:
    by_floor: dict[int, list[str]] = {}
    for m, h in floor.items():
        by_floor.setdefault(h, []).append(m)
    for h in sorted(by_floor):
        print(f"  {h:2d}: {', '.join(sorted(by_floor[h]))}")


def main(root: Path) -> None:
    files, edges, local = read_package(root)
    print_by_floor(print_graph("layers", layer_edges(edges, root)))
    lines = sum(len(p.read_text().splitlines()) for p in files.values())
    floor = print_graph("modules", edges, f" ({lines} lines)")
    outside = [x for x in local if not (x[0] == f"{root.name}.cli" or x[0].startswith(f"{root.name}.cli."))]
    print(f"function-local package imports: {len(local)}, outside the cli: {len(outside)}")
    for mod, line, t in outside:
        print(f"  {mod}:{line} imports {t}")
    print("largest files (lines):")
    for p in sorted(files.values(), key=lambda p: -len(p.read_text().splitlines()))[:8]:
        print(f"  {len(p.read_text().splitlines()):5d}  {p.relative_to(root.parent)}")
    print("modules by floor:")
    print_by_floor(floor)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "reslm")
