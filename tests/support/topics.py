"""Topic names no other test (or an earlier run against the same external broker) has used, and creating a
topic through librdkafka's admin client."""

from __future__ import annotations

import uuid


def unique_topic(prefix: str = "t") -> str:
    """``prefix`` plus ten random hex digits: tests sharing a broker never see each other's records."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, topic: str, partitions: int = 2, config: dict | None = None) -> None:
    """Create ``topic`` (replication factor 1, ``config`` as topic configs) through confluent-kafka's
    AdminClient; raises what the broker answered if it fails."""
    # Imported here: most modules that name topics never use librdkafka, and need not load it.
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(30)
