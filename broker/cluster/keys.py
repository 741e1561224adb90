"""The cluster's layout in etcd, and the JSON of each key. Pure: bytes in, values out.

ZooKeeper-era Kafka kept its metadata in znodes; copyless keeps the same facts in etcd keys, under one
prefix per cluster::

    /<root>/cluster_id                          the cluster id (created once, by the first broker)
    /<root>/<cluster_id>/brokers/<id>           on the broker's lease:
                                                {"endpoints": {"NAME": "host:port"}, "directory_id": ...,
                                                 "previous_epoch": E}
                                                its create_revision is the broker epoch; previous_epoch the
                                                epoch whose data this process still holds in full, or -1
                                                (``broker.cluster.incarnation``)
    /<root>/<cluster_id>/controller             on the controller's lease: {"broker_id": N}
    /<root>/<cluster_id>/controller_epoch       the election count; its mod_revision fences every
                                                controller write
    /<root>/<cluster_id>/topics/<name>          {"topic_id": ..., "assignment": [[1,2,3], ...], "configs": {..}}
    /<root>/<cluster_id>/partitions/<name>/<p>  {"leader": 1, "leader_epoch": 4, "isr": [1,2],
                                                 "isr_epochs": [31, 57], "controller_epoch": 7};
                                                mod_revision = partition version; isr_epochs[i] is the
                                                broker epoch isr[i] was admitted under (0: not known)
    /<root>/<cluster_id>/producer_id_block      the first producer id not yet reserved by any broker
    /<root>/<cluster_id>/configs/brokers/<key>  dynamic broker configs, {"name": "value"}; key "default"
                                                for every broker, else a node id

``root`` is ``copyless`` unless the metadata URL names another (``etcd://host:port/ROOT``), so several
clusters can share one etcd. Topic names cannot contain ``/``, so no name's keys can shadow another's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from copyless.broker.cluster.etcd_client import KeyValue
from copyless.broker.cluster.image import BrokerInfo, ClusterImage, TopicInfo
from copyless.broker.partition import PartitionState

__all__ = ["Layout", "decode_image", "encode_broker", "encode_topic", "encode_state", "decode_state",
           "decode_isr_epochs"]


@dataclass(frozen=True)
class Layout:
    """Key names for one cluster. ``root`` is the chroot; ``cluster_id`` names the cluster's prefix."""

    root: str
    cluster_id: str = ""

    @property
    def cluster_id_key(self) -> bytes:
        return f"/{self.root}/cluster_id".encode()

    @property
    def prefix(self) -> bytes:
        return f"/{self.root}/{self.cluster_id}/".encode()

    def broker(self, node_id: int) -> bytes:
        return self.prefix + f"brokers/{node_id}".encode()

    @property
    def controller(self) -> bytes:
        return self.prefix + b"controller"

    @property
    def controller_epoch(self) -> bytes:
        return self.prefix + b"controller_epoch"

    def topic(self, name: str) -> bytes:
        return self.prefix + f"topics/{name}".encode()

    def partitions_of(self, name: str) -> bytes:
        return self.prefix + f"partitions/{name}/".encode()

    def partition(self, name: str, partition: int) -> bytes:
        return self.partitions_of(name) + str(partition).encode()

    @property
    def producer_id_block(self) -> bytes:
        return self.prefix + b"producer_id_block"

    def broker_configs(self, key: str) -> bytes:
        """The dynamic configs of ``key`` ("" every broker, "<id>" one)."""
        return self.prefix + f"configs/brokers/{key or 'default'}".encode()


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def encode_broker(endpoints: dict[str, tuple[str, int]], directory_id: str, rack: str | None = None,
                  previous_epoch: int = -1) -> bytes:
    return _json({"endpoints": {name: f"{host}:{port}" for name, (host, port) in endpoints.items()},
                  "directory_id": directory_id, "rack": rack, "previous_epoch": previous_epoch})


def decode_broker(node_id: int, kv: KeyValue) -> tuple[BrokerInfo, str]:
    """(BrokerInfo, directory id) of a registration."""
    data = json.loads(kv.value)
    endpoints = {}
    for name, address in data.get("endpoints", {}).items():
        host, _, port = str(address).rpartition(":")
        endpoints[name] = (host, int(port))
    info = BrokerInfo(node_id, endpoints, epoch=kv.create_revision, rack=data.get("rack"),
                      previous_epoch=int(data.get("previous_epoch", -1)))
    return info, str(data.get("directory_id", ""))


def encode_topic(topic: TopicInfo) -> bytes:
    return _json({"topic_id": str(topic.topic_id), "assignment": [list(r) for r in topic.assignment],
                  "configs": dict(topic.configs), "internal": topic.internal})


def decode_topic(name: str, value: bytes) -> TopicInfo:
    data = json.loads(value)
    return TopicInfo(name=name, topic_id=uuid.UUID(data["topic_id"]),
                     assignment=tuple(tuple(int(b) for b in replicas) for replicas in data["assignment"]),
                     configs={str(k): str(v) for k, v in data.get("configs", {}).items()},
                     internal=bool(data.get("internal", False)))


def encode_state(state: PartitionState, controller_epoch: int, isr_epochs: Mapping[int, int] | None = None) -> bytes:
    """The partition's state key. The replicas live in the topic's assignment, not here. ``isr_epochs``
    maps ISR members to the broker epoch each was admitted under (a member left out: 0, not known)."""
    epochs = dict(isr_epochs or {})
    return _json({"leader": state.leader, "leader_epoch": state.leader_epoch, "isr": list(state.isr),
                  "isr_epochs": [int(epochs.get(member, 0)) for member in state.isr],
                  "controller_epoch": controller_epoch})


def decode_isr_epochs(value: bytes) -> dict[int, int]:
    """ISR member -> the broker epoch it was admitted under, from a state key (0 where not recorded: a state
    written before the epochs were). Raises ValueError, KeyError, TypeError on a key that does not parse."""
    data = json.loads(value)
    isr = [int(b) for b in data["isr"]]
    epochs = [int(e) for e in data.get("isr_epochs", ())]
    if len(epochs) != len(isr):
        epochs = [0] * len(isr)
    return dict(zip(isr, epochs, strict=True))


def decode_state(value: bytes, replicas: tuple[int, ...], version: int) -> tuple[PartitionState, int]:
    """(PartitionState, the controller epoch that wrote it)."""
    data = json.loads(value)
    state = PartitionState(leader=int(data["leader"]), leader_epoch=int(data["leader_epoch"]),
                           isr=tuple(int(b) for b in data["isr"]), replicas=replicas, version=version)
    return state, int(data.get("controller_epoch", -1))


def decode_image(layout: Layout, kvs: Iterable[KeyValue], revision: int) -> ClusterImage:
    """Build the image from every key under ``layout.prefix`` (as of ``revision``). Keys that do not parse
    are skipped (a corrupt key must not stop a broker; the controller rewrites states it needs)."""
    prefix = layout.prefix
    brokers: dict[int, BrokerInfo] = {}
    topics: dict[str, TopicInfo] = {}
    states: list[tuple[str, int, KeyValue]] = []
    controller_id = -1
    broker_configs: dict[str, dict[str, str]] = {}
    for kv in kvs:
        if not kv.key.startswith(prefix):
            continue
        rest = kv.key[len(prefix):].decode("utf-8", "replace")
        try:
            if rest.startswith("brokers/"):
                node_id = int(rest[len("brokers/"):])
                brokers[node_id] = decode_broker(node_id, kv)[0]
            elif rest.startswith("topics/"):
                name = rest[len("topics/"):]
                topics[name] = decode_topic(name, kv.value)
            elif rest.startswith("partitions/"):
                name, _, number = rest[len("partitions/"):].rpartition("/")
                states.append((name, int(number), kv))
            elif rest == "controller":
                controller_id = int(json.loads(kv.value)["broker_id"])
            elif rest.startswith("configs/brokers/"):
                key = rest[len("configs/brokers/"):]
                values = {str(k): str(v) for k, v in dict(json.loads(kv.value)).items()}
                if values:
                    broker_configs["" if key == "default" else str(int(key))] = values
        except (ValueError, KeyError, TypeError):
            continue
    partitions: dict[tuple[str, int], PartitionState] = {}
    isr_epochs: dict[tuple[str, int], dict[int, int]] = {}
    for name, index, kv in states:
        topic = topics.get(name)
        if topic is None or not 0 <= index < topic.partitions:
            continue
        try:
            partitions[(name, index)] = decode_state(kv.value, topic.assignment[index], kv.mod_revision)[0]
            isr_epochs[(name, index)] = decode_isr_epochs(kv.value)
        except (ValueError, KeyError, TypeError):
            continue
    return ClusterImage(revision=revision, cluster_id=layout.cluster_id, controller_id=controller_id,
                        brokers=brokers, topics=topics, partitions=partitions, broker_configs=broker_configs,
                        isr_epochs=isr_epochs)
