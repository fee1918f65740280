"""The map cannot drift: docs/architecture.md's floors are the floors of the code's own imports, and its
tree names every module of the package (and no module that is gone).

The graph is read with `ast` (nothing is imported). A module's edges are its reslm imports at module
level, to the module whose names it takes (`import reslm.x`, `from reslm.x import y`: reslm.x, or
reslm.x.y where y is a module; the package __init__ that Python runs on the way is not counted). A
layer is a subpackage of reslm (reslm/data, reslm/models, ...: its modules as one unit; an import
between two of them is inside the layer) or a top-level module. A layer's floor is 1 + the highest
floor among the layers it imports, so a layer imports only from floors below its own. An import made
inside a function hides an edge from the graph, so only the command line may make one.
"""
import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "reslm"
MAP = ROOT / "docs" / "architecture.md"
MAX_FLOORS = 7
MAX_LOOSE = 6   # top-level modules besides __init__.py: the rest of the package lives in rooms


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def targets(node, mod: str) -> list[str]:
    """The reslm modules whose names an import statement in module `mod` takes."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "reslm"]
    if not isinstance(node, ast.ImportFrom):
        return []
    module = node.module or ""
    if node.level:   # relative: from the package that holds mod
        base = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
        module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
    if module.split(".")[0] != "reslm":
        return []
    subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in MODULES]
    return subs + ([module] if len(subs) < len(node.names) else [])


@functools.cache
def read_graph() -> tuple[dict[str, set[str]], list[str]]:
    """Each module's module-level edges, and the imports made inside a function ("mod:line imports x")."""
    edges, local = {m: set() for m in MODULES}, []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        in_function = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                       for n in ast.walk(fn)}
        for node in ast.walk(tree):
            for t in targets(node, mod):
                if id(node) in in_function:
                    local.append(f"{mod}:{node.lineno} imports {t}")
                elif t in MODULES and t != mod:
                    edges[mod].add(t)
    return edges, local


def layer(mod: str) -> str:
    """reslm.data.bpe -> reslm.data (a subpackage is one layer); reslm.ngram -> reslm.ngram."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()) else mod


def layer_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, ts in edges.items():
        out.setdefault(layer(m), set()).update(layer(t) for t in ts if layer(t) != layer(m))
    return out


def reach(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Every node's reachable nodes (itself only where a path leads back to it)."""
    out = {}
    for v in edges:
        seen, todo = set(), list(edges[v])
        while todo:
            w = todo.pop()
            if w not in seen:
                seen.add(w)
                todo.extend(edges[w])
        out[v] = seen
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that import each other, directly or through others."""
    r = reach(edges)
    groups = {frozenset({v} | {w for w in r[v] if v in r[w]}) for v in edges if v in r[v]}
    return sorted(sorted(g) for g in groups)


def floors(edges: dict[str, set[str]]) -> dict[str, int]:
    """1 + the highest floor below (the graph has no cycle)."""
    floor: dict[str, int] = {}

    def f(v: str) -> int:
        if v not in floor:
            floor[v] = 1 + max((f(w) for w in edges[v]), default=0)
        return floor[v]

    for v in edges:
        f(v)
    return floor


def documented_floors() -> dict[str, int]:
    """The layers of docs/architecture.md's tree: `  name/ (or name.py)   N. what it is`."""
    out = {}
    for names, n in re.findall(r"^  (\S+(?: \S+)*?) {2,}(\d+)\. ", MAP.read_text(), flags=re.M):
        for name in names.split():
            out["reslm." + name.removesuffix("/").removesuffix(".py")] = int(n)
    return out


def tree_sections() -> dict[str, str]:
    """docs/architecture.md's tree, one text per layer ("core", "paper", ...): the layer's own line
    (indented two spaces: `  core/` or `  paper.py`) and the more deeply indented lines under it."""
    tree = MAP.read_text(encoding="utf-8").split("```")[1]
    out, names = {}, []
    for line in tree.splitlines():
        head = re.match(r"^  (\S+(?: \S+)*?)(?: {2,}|$)", line)
        if head:   # a layer's line: one name, or several that share a floor (`  a.py b.py   N. ...`)
            names = [n.removesuffix("/").removesuffix(".py") for n in head.group(1).split()]
            out.update((n, line) for n in names)
        for n in names if not head else []:
            out[n] += "\n" + line
    return out


def unnamed_modules(sections: dict[str, str]) -> list[str]:
    """The package's module files the tree does not name: a top-level module without a line of its
    own, or a module of a subpackage whose NAME.py (its path inside the layer) is not in that layer's
    part of the tree. A package's __init__.py is the layer's own line."""
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        layer_name, *inside = path.relative_to(PKG).parts
        if not inside:
            if path.stem not in sections and path.name != "__init__.py":
                missing.append(f"reslm/{path.name}: a line of its own, `  {path.name}   N. what it is`")
        elif path.name != "__init__.py":
            name = "/".join(inside)
            if not re.search(rf"(?<![\w/.]){re.escape(name)}\b", sections.get(layer_name, "")):
                missing.append(f"reslm/{layer_name}/{name}: under `  {layer_name}/`, "
                               f"`    {name}   what it holds` (one line)")
    return missing


def table(floor: dict[str, int]) -> str:
    by: dict[int, list[str]] = {}
    for m, h in floor.items():
        by.setdefault(h, []).append(m)
    return "\n".join(f"  {h}: {', '.join(sorted(by[h]))}" for h in sorted(by))


def test_no_cycle_between_layers_or_modules():
    edges, _ = read_graph()
    assert not cycles(layer_edges(edges)), f"layers that import each other: {cycles(layer_edges(edges))}"
    assert not cycles(edges), f"modules that import each other: {cycles(edges)}"


def test_at_most_seven_floors():
    floor = floors(layer_edges(read_graph()[0]))
    assert max(floor.values()) <= MAX_FLOORS, f"{max(floor.values())} floors:\n{table(floor)}"


def test_at_most_six_loose_modules_on_the_ground_floor():
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_LOOSE, (f"{len(loose)} top-level modules under reslm/ ({', '.join(loose)}): move a "
                                     f"module into the room its job belongs to")


def test_the_layers_stand_on_the_floors_docs_architecture_gives_them():
    floor = floors(layer_edges(read_graph()[0]))
    assert floor.pop("reslm") == 1, "reslm/__init__.py imports nothing of reslm"
    documented = documented_floors()
    wrong = {m: (documented.get(m), floor.get(m)) for m in documented.keys() | floor.keys()
             if documented.get(m) != floor.get(m)}
    assert not wrong, ("layer: (docs/architecture.md's floor, the imports' floor); move the import or the "
                       f"line in the table:\n{wrong}\nthe floors of the imports:\n{table(floor)}")


def test_docs_architecture_names_every_module_and_no_module_that_is_gone():
    """A new module cannot go unmapped: every reslm/**.py is named in the tree under its layer, and every
    NAME.py the tree names under a subpackage is a file of that subpackage (or, written with its folder,
    a file of the repository)."""
    sections = tree_sections()
    missing = unnamed_modules(sections)
    assert not missing, ("docs/architecture.md's tree does not name these modules; add each with a one-line "
                         "role:\n  " + "\n  ".join(missing))
    gone = [f"{layer_name}/: {name}" for layer_name, text in sections.items() if (PKG / layer_name).is_dir()
            for name in re.findall(r"(?<![\w/.])([\w/]+\.py)\b", text)
            if not (PKG / layer_name / name).is_file() and not ("/" in name and (ROOT / name).is_file())]
    assert not gone, "docs/architecture.md's tree names modules that do not exist:\n  " + "\n  ".join(gone)


def test_the_module_check_names_what_the_tree_leaves_out():
    """The check itself: a tree without radii.py, or without paper.py's line, names exactly those."""
    sections = tree_sections()
    core = sections["core"].replace("radii.py", "radii")
    without = {**{k: v for k, v in sections.items() if k != "paper"}, "core": core}
    new = [m.split(":")[0] for m in unnamed_modules(without) if m not in unnamed_modules(sections)]
    assert new == ["reslm/core/radii.py", "reslm/paper.py"], new


def test_no_import_inside_a_function_outside_the_cli():
    local = [x for x in read_graph()[1] if not re.match(r"reslm\.cli[.:]", x)]
    assert not local, "an import inside a function hides an edge from the floors: move the shared piece down\n" + \
        "\n".join(local)


def test_the_graph_is_read_as_python_resolves_it():
    """The reader's own rules, on this package: a module taken by name, a submodule, the layers."""
    edges, _ = read_graph()
    assert "reslm.train.batches" in edges["reslm.train.loop"]          # from reslm.train.batches import ...
    assert "reslm.core.distributed" in edges["reslm.train.loop"]       # from reslm.core import distributed
    assert "reslm.core" not in edges["reslm.train.loop"]
    assert "reslm" in edges["reslm.train.config"]                      # import reslm (its __version__)
    assert (layer("reslm.models.rc"), layer("reslm.models"), layer("reslm.ngram"), layer("reslm")) == (
        "reslm.models", "reslm.models", "reslm.ngram", "reslm")
