"""The partition log's parts own their state (docs/seams.md): a class reads only attributes it declares, and
no part reaches into another's private attributes. Read from the sources with ``ast``, as the import-graph
check is: a new need is a constructor argument or a public member, added in view."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STORAGE = Path(__file__).resolve().parents[2] / "broker" / "storage"
# PartitionLog and what it is composed of.
PARTS = ("partition_log", "log_segments", "flusher", "preparation", "loader", "log_reads", "retention",
         "truncation", "cleaner")
NAMED_TUPLE_API = ("_replace", "_asdict", "_fields")  # public, despite the underscore


def _tree(module: str) -> ast.Module:
    return ast.parse((STORAGE / f"{module}.py").read_text(), filename=f"{module}.py")


def _declared(cls: ast.ClassDef) -> set[str]:
    """What a class declares: its methods, properties and class attributes, and every ``self.x`` it assigns."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(element, ast.Attribute) and isinstance(element.value, ast.Name) \
                        and element.value.id == "self":
                    names.add(element.attr)
    return names


def _self_reads(cls: ast.ClassDef) -> set[tuple[str, int]]:
    return {(node.attr, node.lineno) for node in ast.walk(cls)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"}


@pytest.mark.parametrize("module", PARTS)
def test_each_class_reads_only_what_it_declares(module):
    undeclared = []
    for cls in (node for node in _tree(module).body if isinstance(node, ast.ClassDef)):
        if cls.bases and not all(isinstance(base, ast.Name) and base.id in ("NamedTuple", "object")
                                 for base in cls.bases):
            continue  # state from a base class is not visible here (none of the parts has one)
        declared = _declared(cls)
        undeclared += [f"{module}.py:{line}: {cls.name} reads self.{name}, which it never declares"
                       for name, line in sorted(_self_reads(cls), key=lambda item: item[1]) if name not in declared]
    assert not undeclared, "\n".join(undeclared)


@pytest.mark.parametrize("module", PARTS)
def test_no_part_reaches_into_another_objects_private_attributes(module):
    reaches = [f"{module}.py:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(_tree(module))
               if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
               and node.attr not in NAMED_TUPLE_API
               and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    assert not reaches, "\n".join(reaches)


def test_the_parts_are_classes_of_their_own_not_mixins():
    (partition_log,) = [node for node in _tree("partition_log").body
                        if isinstance(node, ast.ClassDef) and node.name == "PartitionLog"]
    assert partition_log.bases == [], [ast.unparse(base) for base in partition_log.bases]
