"""The package's modules import each other without a circle.

The graph is built from the sources with ``ast`` (nothing is imported): one node per module of the installed
package, found through pyproject's ``package-dir`` mapping (``broker/`` is ``copyless.broker``, ``client/``
is ``copyless.client``), and an edge for every import of another module of the package, wherever it is
written: at the top, inside a function (a deferred import hides a circle from Python, not from a reader) or
under ``if TYPE_CHECKING:`` (a circle in the types is one a reader and a type checker still follow). A
``from package import name`` counts as an import of the submodule when ``name`` is one, else of the package.
In a module that calls ``importlib.import_module``, a string naming a module of the package is an edge too
(the handler table and the CLI's command modules are loaded so). The parent packages that Python
initialises on the way are not edges: a package's ``__init__`` re-exporting its submodules would otherwise
make every package a circle.

A circle is broken by moving what both sides need into a module of its own, or by a typed interface
(``copyless.broker.interfaces``) in place of the concrete class (docs/seams.md).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Edges still known to close a circle, each with why it is still there. The check leaves them out, fails on
# any other circle, and fails when one of them is gone (delete its entry then).
KNOWN_EDGES: dict[tuple[str, str], str] = {}


def package_modules() -> dict[str, Path]:
    """Module name -> source file, for every module the distribution installs."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = setuptools["package-dir"]
    modules: dict[str, Path] = {}
    for package in setuptools["packages"]:
        # The longest mapped prefix names the folder (copyless.broker.storage -> broker/storage).
        prefix = max((name for name in package_dir if package == name or package.startswith(name + ".")), key=len)
        folder = ROOT / package_dir[prefix] / Path(*package[len(prefix):].split(".")[1:])
        for path in folder.glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    tree = ast.parse(path.read_text(), str(path))
    dynamic = any(isinstance(node, ast.Attribute) and node.attr == "import_module" for node in ast.walk(tree))
    for node in ast.walk(tree):
        if dynamic and isinstance(node, ast.Constant) and node.value in modules:
            found.add(node.value)  # a module name handed to importlib.import_module (the handler table)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                resolve(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
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


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    return "\n".join(f"  {module} -> {', '.join(sorted(graph[module] & members))}" for module in component)


def test_the_graph_covers_the_package():
    graph = import_graph()
    # The three roots of the mapping and the modules the seams are about are all nodes.
    for module in ("copyless", "copyless.broker.state", "copyless.broker.handlers", "copyless.broker.interfaces",
                   "copyless.broker.storage.partition_log", "copyless.client.cli", "copyless.protocol"):
        assert module in graph, module
    # A top-level import, a relative one and a function-local one are all edges.
    assert "copyless.broker.replica_manager" in graph["copyless.broker.state"]
    assert "copyless.broker.storage.segment" in graph["copyless.broker.storage.partition_log"]
    assert "copyless.client.admin_cli" in graph["copyless.client.cli"]
    assert "copyless.broker.handlers.produce" in graph["copyless.broker.handlers"]  # loaded by name


def test_the_finder_sees_a_circle_through_a_deferred_or_type_only_import(tmp_path):
    sources = {
        "a": "from copyless.pkg import b\n",
        "b": "def later():\n    from copyless.pkg.c import thing\n",
        "c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
        "d": "from . import a\n",
        "e": "import importlib\nNAMES = ('copyless.pkg.d', 'not.a.module')\nimportlib.import_module(NAMES[0])\n",
    }
    modules = {}
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
        modules[f"copyless.pkg.{name}"] = tmp_path / f"{name}.py"
    graph = {module: imports_of(module, path, modules) for module, path in modules.items()}
    assert graph["copyless.pkg.d"] == {"copyless.pkg.a"}
    assert graph["copyless.pkg.e"] == {"copyless.pkg.d"}
    assert circles(graph) == [["copyless.pkg.a", "copyless.pkg.b", "copyless.pkg.c"]]


def test_no_import_circle():
    graph = import_graph()
    for (source, target), _why in KNOWN_EDGES.items():
        assert target in graph[source], f"{source} no longer imports {target}: delete its KNOWN_EDGES entry"
        graph[source] = graph[source] - {target}
    found = circles(graph)
    assert not found, "import circles:\n" + "\n\n".join(describe(graph, component) for component in found)


def test_the_wire_core_imports_neither_the_broker_nor_the_client():
    # copyless.protocol (records, framing, fetch decoding, SCRAM) is what both sides share: it stands alone.
    graph = import_graph()
    core = {module for module in graph if module == "copyless.protocol" or module.startswith("copyless.protocol.")}
    assert len(core) > 5
    reaches = {(module, target) for module in core for target in graph[module]
               if target.startswith(("copyless.broker", "copyless.client"))}
    assert not reaches, sorted(reaches)
