"""The seams of broker/interfaces.py hold: the handlers reach nothing past them, and the concrete classes
(Broker, ReplicaManager, both metadata backends) have every member, with the same parameters.

No type checker runs over the tree yet, so these two checks are what keeps a Protocol from drifting away
from the code on either side of it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from copyless.broker import interfaces
from copyless.broker.cluster.backend import MetadataBackend
from copyless.broker.cluster.embedded import EmbeddedMetadata
from copyless.broker.cluster.etcd_metadata import EtcdMetadata
from copyless.broker.config import BrokerConfig
from copyless.broker.handlers import HandlerTable
from copyless.broker.replica_manager import ReplicaManager
from copyless.broker.state import Broker

HANDLERS = Path(interfaces.__file__).resolve().parent / "handlers"


def members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def reached(tree: ast.AST) -> dict[str, set[str]]:
    """Attribute names a handler module reads off ``ctx.broker`` (or a local ``broker``), and off its
    ``replicas``, ``metadata`` and ``handlers`` (directly, or through a local of that name)."""
    found: dict[str, set[str]] = {"broker": set(), "replicas": set(), "metadata": set(), "handlers": set()}

    def is_broker(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "broker") or (
            isinstance(node, ast.Attribute) and node.attr == "broker" and isinstance(node.value, ast.Name)
            and node.value.id == "ctx")

    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if is_broker(base):
            found["broker"].add(node.attr)
        elif isinstance(base, ast.Attribute) and base.attr in found and is_broker(base.value):
            found[base.attr].add(node.attr)
        elif isinstance(base, ast.Name) and base.id in ("replicas", "metadata"):
            found[base.id].add(node.attr)
    return found


PROTOCOLS = {"broker": interfaces.BrokerServices, "replicas": interfaces.Replicas,
             "metadata": interfaces.Metadata, "handlers": interfaces.ServedApis}


@pytest.mark.parametrize("path", sorted(HANDLERS.glob("*.py")), ids=lambda path: path.name)
def test_a_handler_reaches_only_the_interfaces(path):
    if path.name == "__init__.py":
        return
    found = reached(ast.parse(path.read_text()))
    for part, names in found.items():
        extra = names - members(PROTOCOLS[part])
        assert not extra, f"{path.name} reaches {part}.{sorted(extra)}: not in {PROTOCOLS[part].__name__}"


def test_the_reach_check_sees_every_way_a_handler_names_the_broker():
    source = ("async def handle(ctx, request):\n    broker = ctx.broker\n    replicas = broker.replicas\n"
              "    ctx.broker.secret_a\n    broker.metadata.secret_b\n    replicas.secret_c\n"
              "    ctx.broker.handlers.secret_d\n")
    found = reached(ast.parse(source))
    assert found == {"broker": {"replicas", "secret_a", "metadata", "handlers"}, "replicas": {"secret_c"},
                     "metadata": {"secret_b"}, "handlers": {"secret_d"}}


def check_conforms(protocol: type, concrete: object) -> None:
    """Every member of ``protocol`` is on ``concrete`` (a class or an instance); a method takes the same
    parameters (names, kinds, and a default wherever the protocol has one)."""
    cls = concrete if isinstance(concrete, type) else type(concrete)
    # Attributes set in __init__ are on an instance, or declared on the class (MetadataBackend.image).
    annotated = {name for klass in cls.__mro__ for name in vars(klass).get("__annotations__", {})}
    for name in sorted(members(protocol)):
        declared = vars(protocol)[name]
        assert hasattr(concrete, name) or name in annotated, f"{cls.__name__} lacks {name}"
        if isinstance(declared, property) or not callable(declared):
            continue
        wanted = list(inspect.signature(declared).parameters.values())[1:]
        actual = inspect.signature(getattr(concrete, name))
        got = list(actual.parameters.values())
        if isinstance(concrete, type):  # an unbound function: drop self
            got = got[1:]
        assert [(p.name, p.kind) for p in got] == [(p.name, p.kind) for p in wanted], f"{name}{actual}"
        for want, have in zip(wanted, got, strict=True):
            if want.default is not inspect.Parameter.empty:
                assert have.default is not inspect.Parameter.empty, f"{name}: {have.name} has no default"
        assert inspect.iscoroutinefunction(declared) == inspect.iscoroutinefunction(getattr(concrete, name)), name


def test_the_broker_and_its_parts_satisfy_the_interfaces(tmp_path):
    broker = Broker(BrokerConfig(data_dir=tmp_path / "data", listen_host="127.0.0.1", listen_port=0))
    check_conforms(interfaces.BrokerServices, broker)
    check_conforms(interfaces.Replicas, broker.replicas)
    assert isinstance(broker.replicas, ReplicaManager)
    check_conforms(interfaces.Metadata, broker.metadata)
    assert isinstance(broker.metadata, EmbeddedMetadata)
    check_conforms(interfaces.ServedApis, broker.handlers)
    assert isinstance(broker.handlers, HandlerTable)


def test_both_metadata_backends_satisfy_the_interface():
    for backend in (EmbeddedMetadata, EtcdMetadata):
        assert issubclass(backend, MetadataBackend)
        check_conforms(interfaces.Metadata, backend)


def test_a_missing_member_or_a_changed_signature_is_caught():
    class Short:
        def get(self, topic, partition):
            return None

    with pytest.raises(AssertionError, match="lacks"):
        check_conforms(interfaces.Replicas, Short)

    class Renamed(ReplicaManager):
        def get(self, topic, index):
            return None

    with pytest.raises(AssertionError, match="get"):
        check_conforms(interfaces.Replicas, Renamed)
