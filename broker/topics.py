"""The topic registry: which topics exist, their partition counts and config overrides, persisted in the
data dir so they come back after a restart.

On-disk format: ``<data_dir>/topics.json``, rewritten whole on every change (topics change rarely) with
tmp + fsync + rename + directory fsync, so a crash leaves either the old or the new file::

    {"version": 1,
     "topics": [{"name": "orders", "partitions": 3, "internal": false,
                 "topic_id": "4b8d...-uuid", "configs": {"retention.ms": "86400000"}}]}

Name rules are Kafka's (``org.apache.kafka.common.internals.Topic.validate``): 1..249 characters from
``[a-zA-Z0-9._-]``, not ``.`` or ``..``; and a new name must not collide with an existing one once ``.`` is
mapped to ``_`` (metric names would clash). Config overrides use Kafka's topic config names and are checked
against the one registry of settings (``broker.config.CONFIGS``): the ones the log implements map onto
``LogConfig``, and unknown names or values a setting's validator refuses are INVALID_CONFIG, as in Kafka.

The registry itself is pure bookkeeping plus ``persist()`` (blocking: call it in a worker thread). Creating
and deleting the partition logs is the Broker's job.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from kio.schema.errors import ErrorCode

from copyless.broker._files import write_atomically
from copyless.broker.config import CONFIGS, ConfigError
from copyless.broker.errors import BrokerError

__all__ = [
    "Topic",
    "TopicRegistry",
    "TopicError",
    "validate_topic_name",
    "check_new_topic_name",
    "parse_topic_configs",
    "MAX_NAME_LENGTH",
    "REGISTRY_FILE",
]

REGISTRY_FILE = "topics.json"
MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


class TopicError(BrokerError):
    """A topic operation is refused; ``code`` is the Kafka error code for the client."""


def validate_topic_name(name: str | None) -> None:
    """Kafka's name rules. Raises TopicError(INVALID_TOPIC_EXCEPTION)."""
    if not name:
        raise TopicError(ErrorCode.invalid_topic_exception, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, "Topic name cannot be \".\" or \"..\"")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters",
        )
    if not _LEGAL.match(name):
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'",
        )


def _unify(name: str) -> str:
    return name.replace(".", "_")


def check_new_topic_name(name: str, existing: Iterable[str], *, internal: bool = False) -> None:
    """Raise TopicError when ``name`` cannot be created next to ``existing``: illegal, taken, or colliding
    with a taken name once ``.`` is read as ``_``. O(topics)."""
    validate_topic_name(name)
    unified = _unify(name)
    for other in existing:
        if other == name:
            raise TopicError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")
        if _unify(other) == unified:
            raise TopicError(ErrorCode.invalid_topic_exception, f"Topic '{name}' collides with existing topic: {other}")
    if name in INTERNAL_TOPICS and not internal:
        raise TopicError(ErrorCode.invalid_topic_exception, f"Topic '{name}' is reserved for internal use")


def parse_topic_configs(configs: Mapping[str, str | None]) -> dict:
    """Check a topic's config overrides against the registry (``broker.config.CONFIGS``); return the LogConfig
    field overrides they imply (replication settings and configs without an effect are checked, not returned).

    Raises:
        TopicError(INVALID_CONFIG): unknown name or bad value (named in the message).
    """
    overrides: dict = {}
    for name, value in configs.items():
        if value is None:
            raise TopicError(ErrorCode.invalid_config, f"Null value not supported for topic configs: {name}")
        key = CONFIGS.topic_key(name)
        if key is None:
            matches = CONFIGS.close_matches(name, topic=True)
            hint = f" (did you mean {' or '.join(matches)}?)" if matches else ""
            raise TopicError(ErrorCode.invalid_config, f"Unknown topic config name: {name}{hint}")
        try:
            parsed = key.value_of(value)
        except ConfigError as exc:
            raise TopicError(ErrorCode.invalid_config, str(exc)) from None
        if key.log_field is not None:
            overrides[key.log_field] = parsed
    return overrides


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    configs: Mapping[str, str] = field(default_factory=dict)
    internal: bool = False
    topic_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "partitions": self.partitions,
            "internal": self.internal,
            "topic_id": str(self.topic_id),
            "configs": dict(self.configs),
        }

    @classmethod
    def from_json(cls, data: dict) -> Topic:
        return cls(
            name=str(data["name"]),
            partitions=int(data["partitions"]),
            configs={str(k): str(v) for k, v in dict(data.get("configs", {})).items()},
            internal=bool(data.get("internal", False)),
            topic_id=uuid.UUID(str(data["topic_id"])) if data.get("topic_id") else uuid.uuid4(),
        )


class TopicRegistry:
    """In-memory map of topics, loaded from and persisted to ``<data_dir>/topics.json``.

    Loop thread for reads and mutations; ``persist`` is blocking (fsync) and belongs in a worker thread.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / REGISTRY_FILE
        self._topics: dict[str, Topic] = {}
        self.loaded_from_disk = False

    # --- queries -----------------------------------------------------------------------------------------

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def __iter__(self) -> Iterator[Topic]:
        return iter(list(self._topics.values()))

    def __len__(self) -> int:
        return len(self._topics)

    def names(self) -> list[str]:
        return sorted(self._topics)

    # --- validation ----------------------------------------------------------------------------------------

    def check_new(self, name: str, *, internal: bool = False) -> None:
        """Raise TopicError when ``name`` cannot be created: illegal, existing, or colliding."""
        check_new_topic_name(name, self._topics, internal=internal)

    # --- mutation ------------------------------------------------------------------------------------------

    def add(self, topic: Topic) -> None:
        self._topics[topic.name] = topic

    def remove(self, name: str) -> Topic | None:
        return self._topics.pop(name, None)

    def replace(self, name: str, **changes) -> Topic:
        topic = replace(self._topics[name], **changes)
        self._topics[name] = topic
        return topic

    # --- persistence ---------------------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The file contents for the current state (taken on the loop thread, written off it)."""
        data = {"version": 1, "topics": [topic.to_json() for topic in self._topics.values()]}
        return json.dumps(data, indent=1, sort_keys=True).encode("utf-8")

    def load(self) -> None:
        """Read the file if there is one (blocking; at startup).

        Raises:
            ValueError: the file exists but is not a registry (a corrupt registry is not silently replaced:
                that would orphan every partition log).
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.loaded_from_disk = False
            return
        try:
            data = json.loads(raw)
            topics = [Topic.from_json(item) for item in data["topics"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"topic registry {self.path} is corrupt: {exc}") from exc
        self._topics.clear()
        for topic in topics:
            self.add(topic)
        self.loaded_from_disk = True

    def persist(self, contents: bytes | None = None) -> None:
        """Write ``contents`` (default: a snapshot now). Blocking."""
        write_atomically(self.path, self.snapshot() if contents is None else contents)
