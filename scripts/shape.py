"""Measure the shape of the lakesink package: stdlib only, Python 3.11, well under a second.

    python3 scripts/shape.py [--root src/lakesink] [--json]

--json prints the same figures as JSON. Paths are relative to the root.

size        lines of all .py files and their number; the largest module (lines), the largest
            class (end_lineno - lineno + 1, and its number of direct methods) and the largest
            function or method (same measure, nested ones included), each at path:line.
switches    format switches, by regex over the text: == / != "delta" | "parquet" (either quote)
            and isinstance(..., DeltaTableWriter | ParquetTableWriter), per module. Given for
            every module and outside the formats' own modules (those under a folder named
            `formats`, and tables/delta.py, tables/parquet.py).
config      parameters annotated LakesinkConfig or 'LakesinkConfig', per module; "below the
            application" = outside app.py (and its table wiring, table_parts.py), cli.py,
            demo.py and config/.
imports     the graph between units (a subpackage folder such as config, or a top-level module
            such as app.py) from every import of the package, absolute or relative (resolved):
            at module level ("top"), inside a function ("lazy"), under `if TYPE_CHECKING:`
            ("type"). Edges A -> B for A != B; strongly connected components of more than one
            unit (Tarjan) with the edges inside them and one file:line each (preferring top over
            lazy over type); "upward arrows" = edges against an Eades-Lin-Smyth order (greedy
            feedback arc set; 0 means layered). The same between the modules of one package
            (e.g. config/loader.py <-> config/models.py). All imports, then without TYPE_CHECKING.
first-line  copies of "the first line of an error": splitlines()[0] and
            def _first_line / _summary / _said / one_line, at path:line.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

SWITCH = re.compile(r"""[!=]=\s*(["'])(?:delta|parquet)\1"""
                    r"|isinstance\([^)]*\b(?:Delta|Parquet)TableWriter\b")
FIRST_LINE = re.compile(r"splitlines\(\)\[0\]|def (?:_first_line|_summary|_said|one_line)\b")
KIND_RANK = {"top": 0, "lazy": 1, "type": 2}
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def unit_of(rel: str) -> str:  # config/loader.py -> config ; app.py -> app.py
    return rel.split("/")[0]


def own_format_module(rel: str) -> bool:
    return "formats" in rel.split("/")[:-1] or rel in ("tables/delta.py", "tables/parquet.py")


def below_application(rel: str) -> bool:
    # table_parts.py is app.py's table wiring, moved out of it (2026-12-02)
    return (rel not in ("app.py", "table_parts.py", "cli.py", "demo.py")
            and not rel.startswith("config/"))


def defs(node: ast.AST, prefix: str = ""):
    """Yield (qualified name, node) for every class, function and method."""
    for child in ast.iter_child_nodes(node):
        named = isinstance(child, (ast.ClassDef, *FUNCS))
        if named:
            yield prefix + child.name, child
        yield from defs(child, prefix + child.name + "." if named else prefix)


def imports(tree: ast.Module, modname: str, is_pkg: bool, known: set[str]):
    """(imported module of the package, line, kind) for every import in the tree."""
    top = modname.split(".")[0]

    def existing(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def walk(node: ast.AST, kind: str):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for n, k in [(n, "type") for n in node.body] + [(n, kind) for n in node.orelse]:
                yield from walk(n, k)
            return
        if isinstance(node, (*FUNCS, ast.Lambda)) and kind == "top":
            kind = "lazy"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == top or alias.name.startswith(top + "."):
                    yield existing(alias.name), node.lineno, kind
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = modname.split(".") if is_pkg else modname.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            if base == top or base.startswith(top + "."):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    yield (sub if sub in known else existing(base)), node.lineno, kind
        for child in ast.iter_child_nodes(node):
            yield from walk(child, kind)

    return [(target, line, kind) for target, line, kind in walk(tree, "top") if target]


def tarjan(nodes: list[str], succ: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strong(v: str):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v):]
            del stack[stack.index(v):]
            on.difference_update(comp)
            comps.append(sorted(comp))

    for v in nodes:
        if v not in index:
            strong(v)
    return comps


def eades_order(nodes: list[str], succ: dict[str, set[str]]) -> list[str]:
    """Eades-Lin-Smyth: sinks to the back, sources to the front, else max(out - in)."""
    pred = defaultdict(set)
    for a, bs in list(succ.items()):
        for b in bs:
            pred[b].add(a)
    rest, front, back, moved = set(nodes), [], [], True
    while rest:
        while moved:
            sinks = sorted(v for v in rest if not succ[v] & rest)
            back[:0], rest = sinks, rest - set(sinks)
            sources = sorted(v for v in rest if not pred[v] & rest)
            front, rest = front + sources, rest - set(sources)
            moved = bool(sinks or sources)
        if rest:
            v = max(sorted(rest), key=lambda v: len(succ[v] & rest) - len(pred[v] & rest))
            front, rest, moved = front + [v], rest - {v}, True
    return front + back


def graph(nodes: list[str], edges: dict[tuple[str, str], list[tuple[str, str]]]) -> dict:
    succ = defaultdict(set)
    for a, b in edges:
        succ[a].add(b)

    def edge(a: str, b: str) -> dict:
        where, kind = min(edges[a, b], key=lambda e: (KIND_RANK[e[1]], e[0]))
        return {"from": a, "to": b, "imports": len(edges[a, b]), "example": where, "example_kind": kind,
                "kinds": dict(Counter(k for _, k in edges[a, b]))}

    sccs = [c for c in tarjan(nodes, succ) if len(c) > 1]
    order = eades_order(nodes, succ)
    pos = {v: i for i, v in enumerate(order)}
    return {"nodes": len(nodes), "edges": len(edges),
            "sccs": [{"members": c, "edges": [edge(a, b) for a, b in sorted(edges) if a in c and b in c]}
                     for c in sccs],
            "order": order,
            "upward": [edge(a, b) for a, b in sorted(edges) if pos[a] > pos[b]]}


def measure(root: Path) -> dict:
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    rels = {p: p.relative_to(root).as_posix() for p in files}
    modname = {rel: ".".join([root.name, *rel[:-3].split("/")]).removesuffix(".__init__")
               for rel in rels.values()}
    by_mod = {m: rel for rel, m in modname.items()}
    lines, switches, config_params, first_lines, unparsable = {}, {}, {}, [], []
    biggest = {"class": (0, "", "", 0), "function": (0, "", "")}
    unit_edges, module_edges = defaultdict(list), defaultdict(list)
    for path in files:
        rel, text = rels[path], path.read_text(encoding="utf-8")
        lines[rel] = len(text.splitlines())
        if n := len(SWITCH.findall(text)):
            switches[rel] = n
        first_lines += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}  {m.group(0)}"
                        for m in FIRST_LINE.finditer(text)]
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError as exc:
            unparsable.append(f"{rel}:{exc.lineno}  {exc.msg}")
            continue
        for name, node in defs(tree):
            size, where = node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno}"
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(n, FUNCS) for n in node.body)
                biggest["class"] = max(biggest["class"], (size, name, where, methods))
            else:
                biggest["function"] = max(biggest["function"], (size, name, where))
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
                annotations = [ast.unparse(p.annotation) for p in params if p.annotation]
                if n := sum(t in ("LakesinkConfig", "'LakesinkConfig'") for t in annotations):
                    config_params[rel] = config_params.get(rel, 0) + n
        for target, line, kind in imports(tree, modname[rel], path.name == "__init__.py", set(by_mod)):
            dest, example = by_mod[target], (f"{rel}:{line}", kind)
            if unit_of(rel) != unit_of(dest):
                unit_edges[unit_of(rel), unit_of(dest)].append(example)
            elif rel != dest and "/" in rel:
                module_edges[rel, dest].append(example)

    def graphs(nodes: list[str], edges: dict) -> dict:
        runtime = {e: [x for x in ex if x[1] != "type"] for e, ex in edges.items()}
        return {"all": graph(nodes, edges),
                "no_type_checking": graph(nodes, {e: x for e, x in runtime.items() if x})}

    big, cls, fn = max(lines, key=lambda r: (lines[r], r)), biggest["class"], biggest["function"]
    return {
        "root": str(root), "modules": len(files), "total_lines": sum(lines.values()),
        "unparsable": unparsable, "largest_module": {"path": big, "lines": lines[big]},
        "largest_class": {"name": cls[1], "at": cls[2], "lines": cls[0], "methods": cls[3]},
        "largest_function": {"name": fn[1], "at": fn[2], "lines": fn[0]},
        "format_switches": {
            "total": sum(switches.values()), "per_module": switches,
            "outside_format_modules": sum(n for r, n in switches.items() if not own_format_module(r))},
        "config_params": {
            "total": sum(config_params.values()), "per_module": config_params,
            "below_application": sum(n for r, n in config_params.items() if below_application(r))},
        "unit_graph": graphs(sorted({unit_of(r) for r in rels.values()}), unit_edges),
        "module_graph": graphs(sorted(r for r in rels.values() if "/" in r), module_edges),
        "first_line_copies": {"count": len(first_lines), "at": first_lines},
    }


def print_graph(title: str, g: dict, what: str) -> None:
    def edge(e: dict) -> str:
        kinds = ", ".join(f"{e['kinds'][k]} {k}" for k in KIND_RANK if k in e["kinds"])
        return f"    {e['from']} -> {e['to']}  ({kinds}; e.g. {e['example']} {e['example_kind']})"

    for variant, label in (("all", "all imports"), ("no_type_checking", "without TYPE_CHECKING")):
        r = g[variant]
        print(f"{title}, {label}: {r['nodes']} {what}, {r['edges']} edges, "
              f"{len(r['sccs'])} cycle(s) of >1 {what}, {len(r['upward'])} upward arrow(s)")
        for c in r["sccs"]:
            print(f"  cycle of {len(c['members'])}: {' '.join(c['members'])} ({len(c['edges'])} edges inside)")
            for e in c["edges"] if variant == "all" else []:
                print(edge(e))
        if r["upward"]:
            print(f"  upward arrows against the order {' > '.join(r['order'])}:" if what == "units"
                  else "  upward arrows:")
            for e in r["upward"]:
                print(edge(e))


def report(m: dict) -> None:
    print(f"lakesink shape of {m['root']}")
    print(f"size: {m['total_lines']} lines in {m['modules']} modules")
    print(f"  largest module:   {m['largest_module']['path']} ({m['largest_module']['lines']} lines)")
    c, f = m["largest_class"], m["largest_function"]
    print(f"  largest class:    {c['name']} at {c['at']} ({c['lines']} lines, {c['methods']} methods)")
    print(f"  largest function: {f['name']} at {f['at']} ({f['lines']} lines)")
    for bad in m["unparsable"]:
        print(f"  NOT PARSED (skipped for ast figures): {bad}")
    s, p = m["format_switches"], m["config_params"]
    print(f"format switches: {s['total']} everywhere, {s['outside_format_modules']} outside the formats' "
          "own modules")
    for rel, n in sorted(s["per_module"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3}  {rel}{'  (format module)' if own_format_module(rel) else ''}")
    print(f"LakesinkConfig parameters: {p['total']} in all, {p['below_application']} below the application")
    for rel, n in sorted(p["per_module"].items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n:3}  {rel}{'' if below_application(rel) else '  (application)'}")
    print_graph("unit imports", m["unit_graph"], "units")
    print_graph("module imports inside a package", m["module_graph"], "modules")
    print(f"first-line-of-an-error copies: {m['first_line_copies']['count']}")
    for at in m["first_line_copies"]["at"]:
        print(f"  {at}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure the shape of src/lakesink.")
    parser.add_argument("--root", type=Path, help="the package folder (default: src/lakesink of this checkout)",
                        default=Path(__file__).resolve().parent.parent / "src" / "lakesink")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    m = measure(args.root.resolve())
    if args.json:
        print(json.dumps(m, indent=2))
    else:
        report(m)


if __name__ == "__main__":
    main()
