"""What the security tests share: certificates made by ``cluster/make-certs.sh`` (a real CA and real PEM
files), brokers with SSL / SASL_SSL / SASL_PLAINTEXT listeners and the authorizer on, each listener's bound
port, and the four real clients (kafka-python, aiokafka, confluent-kafka, kcat) plus copyless's own, each
configured from one ``Identity`` (how it authenticates) and driven through the same small operations:

    produce(client, bootstrap, identity, topic, values)            -> error code (0: every record acknowledged)
    consume_group(client, bootstrap, identity, topic, group, n)    -> (error code, values read)
    create_topic(client, bootstrap, identity, topic)               -> error code
    list_topics(client, bootstrap, identity)                       -> set of names

Error codes are Kafka's numbers (29 TOPIC_AUTHORIZATION_FAILED, 30 GROUP_AUTHORIZATION_FAILED, 58
SASL_AUTHENTICATION_FAILED), read from each client's own error objects (kcat: from its message text), so
a test asserts the code a client actually surfaced.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.support.broker_process import BrokerProcess

REPO = Path(__file__).resolve().parents[2]
MAKE_CERTS = REPO / "cluster" / "make-certs.sh"
OP_TIMEOUT_S = 30.0
CLIENTS = ("kafka-python", "aiokafka", "confluent-kafka", "kcat", "copyless")
# Producers that are idempotent unless told otherwise: they ask InitProducerId first, which needs
# IdempotentWrite on the cluster or Write on some topic (CLUSTER_AUTHORIZATION_FAILED otherwise, as in Kafka).
IDEMPOTENT_BY_DEFAULT = frozenset({"kafka-python", "copyless"})
ADMIN_PASSWORD = "admin-secret-Zq9"


def make_certs(directory: Path, *names: str) -> Path:
    """A CA and a certificate per name (``name`` or ``name:SAN,SAN``) in ``directory``. Returns it."""
    subprocess.run([str(MAKE_CERTS), str(directory), *names], check=True, capture_output=True, timeout=60)
    return directory


def listener_ports(broker: BrokerProcess) -> dict[str, int]:
    """Listener name -> bound port, from the broker's last ``serving: listeners=...`` log line."""
    lines = [line for line in broker.log_text().splitlines() if "serving: listeners=" in line]
    assert lines, f"no serving line in the broker log:\n{broker.log_tail()}"
    found = re.findall(r"(\w+)=[\d.]+:(\d+)->", lines[-1].split("serving: listeners=")[1].split(" advertised=")[0])
    return {name: int(port) for name, port in found}


@dataclass(frozen=True)
class Identity:
    """How a client connects: SASL (mechanism, user, password) and/or TLS (CA, client certificate)."""

    protocol: str
    ca: Path | None = None
    username: str | None = None
    password: str | None = None
    mechanism: str = "SCRAM-SHA-512"
    cert: Path | None = None
    key: Path | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def librdkafka(self) -> dict:
        config = {"security.protocol": self.protocol}
        if self.sasl:
            config.update({"sasl.mechanisms": self.mechanism, "sasl.username": self.username,
                           "sasl.password": self.password})
        if self.tls:
            config["ssl.ca.location"] = str(self.ca)
            if self.cert:
                config.update({"ssl.certificate.location": str(self.cert), "ssl.key.location": str(self.key)})
        return config

    def kafka_python(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.sasl:
            config.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                          sasl_plain_password=self.password)
        if self.tls:
            config["ssl_cafile"] = str(self.ca)
            if self.cert:
                config.update(ssl_certfile=str(self.cert), ssl_keyfile=str(self.key))
        return config

    def aiokafka(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.sasl:
            config.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                          sasl_plain_password=self.password)
        if self.tls:
            from aiokafka.helpers import create_ssl_context

            config["ssl_context"] = create_ssl_context(cafile=str(self.ca),
                                                       certfile=str(self.cert) if self.cert else None,
                                                       keyfile=str(self.key) if self.key else None)
        return config

    def copyless(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.sasl:
            config.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                          sasl_plain_password=self.password)
        if self.tls:
            config["ssl_cafile"] = str(self.ca)
            if self.cert:
                config.update(ssl_certfile=str(self.cert), ssl_keyfile=str(self.key))
        return config

    def kcat(self) -> list[str]:
        args = []
        for key, value in self.librdkafka().items():
            args += ["-X", f"{key}={value}"]
        return args


# --- operations -------------------------------------------------------------------------------------------


def _code(exc) -> int:
    """A client exception's Kafka error code (-1 when it names none)."""
    for attribute in ("errno", "code"):
        value = getattr(exc, attribute, None)
        if callable(value):
            value = value()
        if isinstance(value, int) and value > 0:
            return value
    inner = exc.args[0] if getattr(exc, "args", None) else None
    if inner is not None and hasattr(inner, "code") and callable(inner.code):
        return int(inner.code())
    # kafka-python wraps some broker errors in a generic KafkaError whose text names the code.
    found = re.search(r"\[Error (\d+)\]", str(exc))
    return int(found.group(1)) if found else -1


_KCAT_ERRORS = {"Topic authorization failed": 29, "Group authorization failed": 30,
                "Cluster authorization failed": 31, "Authentication failure": 58, "SASL authentication error": 58}


def _kcat_code(text: str) -> int:
    for phrase, code in _KCAT_ERRORS.items():
        if phrase in text:
            return code
    return -1


def produce(client: str, bootstrap: str, identity: Identity, topic: str, values: list[bytes]) -> int:
    if client == "kafka-python":
        from kafka import KafkaProducer

        producer = None
        try:
            producer = KafkaProducer(bootstrap_servers=bootstrap, max_block_ms=10_000, request_timeout_ms=10_000,
                                     **identity.kafka_python())
            futures = [producer.send(topic, v) for v in values]
            for future in futures:
                future.get(timeout=OP_TIMEOUT_S)
            return 0
        except Exception as exc:
            return _code(exc)
        finally:
            if producer is not None:
                producer.close(timeout=5)
    if client == "aiokafka":
        from aiokafka import AIOKafkaProducer

        async def go():
            producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **identity.aiokafka())
            try:
                await producer.start()
                for value in values:
                    await producer.send_and_wait(topic, value)
                return 0
            except Exception as exc:
                return _code(exc)
            finally:
                await producer.stop()

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S + 10))
    if client == "confluent-kafka":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 15_000, **identity.librdkafka()})
        errors = []
        for value in values:
            producer.produce(topic, value, on_delivery=lambda err, _m: errors.append(err))
        producer.flush(OP_TIMEOUT_S)
        failed = [e for e in errors if e is not None]
        assert len(errors) == len(values), f"{len(values) - len(errors)} deliveries unreported"
        return failed[0].code() if failed else 0
    if client == "kcat":
        result = subprocess.run(["kcat", "-b", bootstrap, *identity.kcat(), "-P", "-t", topic,
                                 "-X", "message.timeout.ms=15000"],
                                input=b"\n".join(values) + b"\n", capture_output=True, timeout=OP_TIMEOUT_S + 10)
        text = result.stderr.decode(errors="replace")
        return _kcat_code(text) if (result.returncode or "ERROR" in text or "Delivery failed" in text) else 0
    if client == "copyless":
        from copyless import Producer

        async def go():
            try:
                async with Producer(bootstrap, delivery_timeout_ms=15_000, **identity.copyless()) as producer:
                    for value in values:
                        await (await producer.send(topic, value))
                return 0
            except Exception as exc:
                return _code(exc)

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S + 10))
    raise ValueError(client)


def consume_group(client: str, bootstrap: str, identity: Identity, topic: str, group: str, count: int
                  ) -> tuple[int, list[bytes]]:
    """Consume ``count`` records from the start in ``group`` (committing). (error code, values)."""
    deadline = time.monotonic() + OP_TIMEOUT_S
    values: list[bytes] = []
    if client == "kafka-python":
        from kafka import KafkaConsumer

        consumer = None
        try:
            consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                     request_timeout_ms=15_000, **identity.kafka_python())
            while len(values) < count and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    values += [r.value for r in records]
            consumer.commit()
            return 0, values
        except Exception as exc:
            return _code(exc), values
        finally:
            if consumer is not None:
                consumer.close()
    if client == "aiokafka":
        from aiokafka import AIOKafkaConsumer

        async def go():
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                        auto_offset_reset="earliest", **identity.aiokafka())
            try:
                await consumer.start()
                while len(values) < count and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=500)).values():
                        values.extend(r.value for r in records)
                await consumer.commit()
                return 0, values
            except Exception as exc:
                return _code(exc), values
            finally:
                await consumer.stop()

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S + 15))
    if client == "confluent-kafka":
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                             **identity.librdkafka()})
        try:
            consumer.subscribe([topic])
            while len(values) < count and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    if message.error().code() in (29, 30, 31, 58):
                        return message.error().code(), values
                    continue
                values.append(message.value())
            return 0, values
        finally:
            consumer.close()
    if client == "kcat":
        result = subprocess.run(["kcat", "-b", bootstrap, *identity.kcat(), "-G", group, "-o", "beginning", "-e",
                                 "-c", str(count), "-f", "%s\n", topic],
                                capture_output=True, timeout=OP_TIMEOUT_S + 10)
        text = result.stderr.decode(errors="replace")
        values = [line for line in result.stdout.split(b"\n") if line]
        return (_kcat_code(text) if _kcat_code(text) > 0 else 0), values
    if client == "copyless":
        from copyless import Consumer

        async def go():
            try:
                async with Consumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                    **identity.copyless()) as consumer:
                    while len(values) < count and time.monotonic() < deadline:
                        for records in (await consumer.getmany(timeout_ms=500)).values():
                            values.extend(r.value for r in records)
                    await consumer.commit()
                return 0, values
            except Exception as exc:
                return _code(exc), values

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S + 15))
    raise ValueError(client)


def create_topic(client: str, bootstrap: str, identity: Identity, topic: str, partitions: int = 2) -> int:
    """CreateTopics through the client's admin API (kcat has none: -1 means not applicable)."""
    if client == "kafka-python":
        from kafka.admin import KafkaAdminClient, NewTopic

        admin = None
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000, **identity.kafka_python())
            response = admin.create_topics([NewTopic(topic, partitions, 1)], timeout_ms=10_000)
            codes = [entry[1] for entry in getattr(response, "topic_errors", getattr(response, "topics", []))]
            if not codes and hasattr(response, "topics"):
                codes = [t.error_code for t in response.topics]
            return next((int(c) for c in codes if c), 0)
        except Exception as exc:
            return _code(exc)
        finally:
            if admin is not None:
                admin.close()
    if client == "aiokafka":
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def go():
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **identity.aiokafka())
            try:
                await admin.start()
                response = await admin.create_topics([NewTopic(topic, partitions, 1)])
                errors = [entry[1] for entry in response.topic_errors]
                return next((int(c) for c in errors if c), 0)
            except Exception as exc:
                return _code(exc)
            finally:
                await admin.close()

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S))
    if client == "confluent-kafka":
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap, **identity.librdkafka()})
        future = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10)[topic]
        try:
            future.result(timeout=OP_TIMEOUT_S)
            return 0
        except Exception as exc:
            return _code(exc)
    if client == "copyless":
        from copyless import Admin

        async def go():
            try:
                async with Admin(bootstrap, **identity.copyless()) as admin:
                    await admin.create_topics([topic], num_partitions=partitions)
                return 0
            except Exception as exc:
                return _code(exc)

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S))
    return -1


def list_topics(client: str, bootstrap: str, identity: Identity) -> set[str]:
    """Every topic name the client's all-topics Metadata returns."""
    if client == "kafka-python":
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, **identity.kafka_python())
        try:
            return set(consumer.topics())
        finally:
            consumer.close()
    if client == "confluent-kafka":
        from confluent_kafka.admin import AdminClient

        return set(AdminClient({"bootstrap.servers": bootstrap, **identity.librdkafka()}).list_topics(
            timeout=OP_TIMEOUT_S).topics)
    if client == "kcat":
        result = subprocess.run(["kcat", "-b", bootstrap, *identity.kcat(), "-L", "-J"], capture_output=True,
                                timeout=OP_TIMEOUT_S)
        import json

        return {t["topic"] for t in json.loads(result.stdout)["topics"]}
    if client == "aiokafka":
        from aiokafka import AIOKafkaConsumer

        async def go():
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, **identity.aiokafka())
            await consumer.start()
            try:
                return set(await consumer.topics())
            finally:
                await consumer.stop()

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S))
    if client == "copyless":
        from copyless import Admin

        async def go():
            async with Admin(bootstrap, **identity.copyless()) as admin:
                return set(await admin.list_topics())

        return asyncio.run(asyncio.wait_for(go(), OP_TIMEOUT_S))
    raise ValueError(client)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
