"""Fail when modules of src/koordqos import each other in a cycle (any length), listing each cycle.

Run by `nox -s lint` next to `lint-imports` (whose layers contracts keep packages in order; this keeps
modules acyclic, including within a layer). TYPE_CHECKING imports count too, and so does the import Python
makes implicitly: importing `a.b.c` first runs `a/__init__` and `a/b/__init__` (a package `__init__` that
imports a module which imports back into the package is a cycle even when no two modules name each other).
"""

from __future__ import annotations

import sys

import grimp


def _imports(graph: grimp.ImportGraph, module: str, root: str) -> list[str]:
    """What importing `module` imports: its direct imports and each one's parent packages below `root`."""
    out: set[str] = set()
    for imported in graph.find_modules_directly_imported_by(module):
        parts = imported.split(".")
        for i in range(2, len(parts) + 1):
            name = ".".join(parts[:i])
            if name != module and not module.startswith(name + "."):
                out.add(name)
    out.discard(root)
    return sorted(out)


def cycles(package: str) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph = grimp.build_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(_imports(graph, root, package)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(_imports(graph, child, package))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> int:
    found = cycles("koordqos")
    for component in found:
        print("import cycle:", " <-> ".join(component))
    print(f"{len(found)} import cycle(s) in koordqos")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
