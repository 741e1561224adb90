"""The broker end to end over real sockets, real storage and a real data dir: every served API, the
ordering and acks=0 rules, long-poll wake-ups, byte limits, zero-copy counters, bad input, restarts."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.create_topics.v4 import request as create_v4
from kio.schema.delete_topics.v3.request import DeleteTopicsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as fetch_v4
from kio.schema.fetch.v11 import request as fetch_v11
from kio.schema.init_producer_id.v1.request import InitProducerIdRequest
from kio.schema.metadata.v0 import request as metadata_v0
from kio.schema.metadata.v1 import request as metadata_v1
from kio.schema.metadata.v8 import request as metadata_v8
from kio.schema.offset_for_leader_epoch.v2 import request as epoch_v2
from kio.schema.produce.v3 import request as produce_v3
from kio.schema.produce.v8 import request as produce_v8

from copyless.protocol.records import decode_records, iter_batches
from tests.support.batches import build_batch, frame_batch, values_of
from tests.support.kio_requests import MS, create_topic, fetch, list_offsets, produce
from tests.support.polling import wait_until


def test_api_versions_table_and_fallback(live_broker):
    client = live_broker.client()
    response = client.request(ApiVersionsRequestV0())
    table = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert table[18] == (0, 2) and table[0] == (0, 8) and table[1] == (4, 11) and table[3] == (0, 8)
    # v3 (librdkafka's first request): v0-encoded UNSUPPORTED_VERSION, connection stays open.
    request = struct.pack(">hhih", 18, 3, 77, 4) + b"kcat" + b"\x00" + b"\x05kcat\x041.7\x00"
    client.sock.sendall(struct.pack(">i", len(request)) + request)
    frame = client.read_frame()
    assert struct.unpack_from(">ih", frame) == (77, ErrorCode.unsupported_version)
    assert client.request(ApiVersionsRequestV0()).error_code == ErrorCode.none


def test_metadata_rules_and_auto_create(live_broker):
    client = live_broker.client()
    brokers_only = client.request(metadata_v1.MetadataRequest(topics=()))
    assert brokers_only.topics == () and brokers_only.controller_id == 0
    assert brokers_only.brokers[0].port == live_broker.port
    first = client.request(metadata_v8.MetadataRequest(
        topics=(metadata_v8.MetadataRequestTopic(name="auto1"),), allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
    assert first.topics[0].error_code == ErrorCode.leader_not_available
    assert first.cluster_id == live_broker.broker.cluster_id
    second = client.request(metadata_v8.MetadataRequest(
        topics=(metadata_v8.MetadataRequestTopic(name="auto1"),), allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False, include_topic_authorized_operations=False))
    partition = second.topics[0].partitions[0]
    assert second.topics[0].error_code == ErrorCode.none
    assert (partition.leader_id, partition.leader_epoch, partition.isr_nodes) == (0, 0, (0,))
    refused = client.request(metadata_v8.MetadataRequest(
        topics=(metadata_v8.MetadataRequestTopic(name="no-auto"), metadata_v8.MetadataRequestTopic(name="bad name!")),
        allow_auto_topic_creation=False, include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False))
    assert [t.error_code for t in refused.topics] == [ErrorCode.unknown_topic_or_partition,
                                                      ErrorCode.invalid_topic_exception]
    # All topics: null in v1+, empty array in v0; never auto-creates.
    all_v1 = client.request(metadata_v1.MetadataRequest(topics=None)).topics
    assert [t.name for t in all_v1 if not t.is_internal] == ["auto1"]
    assert all(t.name.startswith("__") for t in all_v1 if t.is_internal)
    # v0 cannot mark internal topics, so it does not list them.
    assert [t.name for t in client.request(metadata_v0.MetadataRequest(topics=())).topics] == ["auto1"]


def test_produce_fetch_zero_copy(live_broker):
    client = live_broker.client()
    assert create_topic(client, "zc", 2).error_code == ErrorCode.none
    batches = [build_batch([b"a%d" % i for i in range(5)]), build_batch([b"b%d" % i for i in range(3)], codec=1)]
    response = produce(client, "zc", {0: batches[0]})
    assert response.responses[0].partition_responses[0].base_offset == 0
    response = produce(client, "zc", {0: batches[1], 1: batches[0]})
    assert [p.base_offset for p in response.responses[0].partition_responses] == [5, 0]
    before = live_broker.stats.fetch_sendfile_bytes
    result = fetch(client, "zc", {0: 0, 1: 0})
    partitions = result.responses[0].partitions
    assert values_of(partitions[0].records) == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"b1", b"b2"]
    assert values_of(partitions[1].records) == [b"a%d" % i for i in range(5)]
    assert [p.high_watermark for p in partitions] == [8, 5]
    # Every record byte went out through sendfile; none were copied through Python.
    sent = len(partitions[0].records) + len(partitions[1].records)
    wait_until(lambda: live_broker.stats.fetch_sendfile_bytes - before == sent,
               what=f"{sent} fetched bytes counted as sent by sendfile", timeout_s=10.0, interval_s=0.005)
    assert live_broker.stats.fetch_copied_bytes == 0
    # Offsets were rewritten in place: the second batch starts at 5.
    second = list(iter_batches(partitions[0].records))[1][1]
    assert second.base_offset == 5 and second.partition_leader_epoch == 0


def test_serving_latency_stats(live_broker):
    """fetch_prepare and fetch_send time each response that carries records (and nothing else); loop_lag
    catches a held loop."""
    client = live_broker.client()
    create_topic(client, "lat")
    produce(client, "lat", {0: build_batch([b"v" * 100] * 10)})
    stats = live_broker.stats
    before, prepared_before = stats.fetch_send.count, stats.fetch_prepare.count
    for _ in range(3):
        assert len(fetch(client, "lat", {0: 0}).responses[0].partitions[0].records) > 0
    empty = fetch(client, "lat", {0: 10}, max_wait_ms=0)
    assert len(empty.responses[0].partitions[0].records or b"") == 0
    produce(client, "lat", {0: build_batch([b"w"])})
    # A write is recorded just after the client has its bytes: wait for the count, then check it stays put
    # (the empty fetch and the produce response, one segment each, are not timed).
    wait_until(lambda: stats.fetch_send.count - before >= 3, what="three timed fetch writes", timeout_s=10.0,
               interval_s=0.005)
    time.sleep(0.1)
    assert stats.fetch_send.count - before == 3
    snapshot = stats.snapshot()["fetch_send"]
    assert 0 < snapshot["p50_ms"] <= snapshot["p99_ms"] < 1000
    assert sum(snapshot["buckets"].values()) == snapshot["count"] == stats.fetch_send.count
    # The preparing side counts the same three responses, and not the empty one.
    assert stats.fetch_prepare.count - prepared_before == 3
    assert 0 < stats.snapshot()["fetch_prepare"]["p99_ms"] < 1000

    # Hold the loop thread for 300 ms, as blocking work on it would: the probe must see it.
    lag_before = stats.loop_lag.count

    async def hold_loop():
        time.sleep(0.3)

    live_broker.call(hold_loop)
    wait_until(lambda: stats.loop_lag.count >= lag_before + 2, what="two more loop-lag probes", timeout_s=10.0,
               interval_s=0.005)
    assert stats.loop_lag.max_s >= 0.2
    assert stats.snapshot()["loop_lag"]["max_ms"] >= 200


def test_no_sendfile_path_copies(inproc_factory):
    live = inproc_factory("asyncio", sendfile=False)
    client = live.client()
    create_topic(client, "copy")
    produce(client, "copy", {0: build_batch([b"x" * 100] * 4)})
    records = fetch(client, "copy", {0: 0}).responses[0].partitions[0].records
    assert values_of(records) == [b"x" * 100] * 4
    wait_until(lambda: live.stats.fetch_copied_bytes == len(records),
               what=f"{len(records)} fetched bytes counted as copied", timeout_s=10.0, interval_s=0.005)
    assert live.stats.fetch_sendfile_bytes == 0


def test_produce_errors(live_broker):
    client = live_broker.client()
    create_topic(client, "errs", configs=[("max.message.bytes", "300")])

    def code_of(records, topic="errs", partition=0, acks=1, module=produce_v8):
        response = produce(client, topic, {partition: records}, acks=acks, module=module)
        return response.responses[0].partition_responses[0].error_code

    assert code_of(build_batch([b"ok"])) == ErrorCode.none
    assert code_of(build_batch([b"x"]), topic="missing") == ErrorCode.unknown_topic_or_partition
    assert code_of(build_batch([b"x"]), partition=3) == ErrorCode.unknown_topic_or_partition
    assert code_of(build_batch([b"x"], corrupt_crc=True)) == ErrorCode.corrupt_message
    assert code_of(build_batch([b"x" * 400])) == ErrorCode.message_too_large
    assert code_of(build_batch([b"x"]), acks=5) == ErrorCode.invalid_required_acks
    assert code_of(build_batch([b"z"], codec=4), module=produce_v3) == ErrorCode.unsupported_compression_type
    create_topic(client, "tiny-segments", configs=[("segment.bytes", "4096")])
    assert code_of(build_batch([b"s" * 100]), topic="tiny-segments") == ErrorCode.none
    assert code_of(build_batch([b"s" * 5000]), topic="tiny-segments") == ErrorCode.record_list_too_large
    # Unknown topics are never auto-created by produce.
    assert live_broker.broker.topic("missing") is None
    assert fetch(client, "errs", {0: 0}).responses[0].partitions[0].high_watermark == 1


def test_responses_in_request_order_and_acks_zero_silent(live_broker):
    client = live_broker.client()
    create_topic(client, "order")
    requests = [
        produce_v8.ProduceRequest(
            transactional_id=None, acks=acks, timeout=1000 * MS,
            topic_data=(produce_v8.TopicProduceData(name="order", partition_data=(
                produce_v8.PartitionProduceData(index=0, records=build_batch([b"%d" % n])),)),),
        )
        for n, acks in enumerate([1, 0, -1, 0, 1])
    ]
    # Pipelined in one write; answers come back in order, none for acks=0.
    first = client.correlation_id + 1
    client.sock.sendall(b"".join(client.frame(r) for r in requests))
    answered = [client.receive(0, 8) for _ in range(3)]
    assert [c for c, _ in answered] == [first, first + 2, first + 4]
    assert [b.responses[0].partition_responses[0].base_offset for _, b in answered] == [0, 2, 4]


def test_acks_zero_error_closes_connection(live_broker):
    client = live_broker.client()
    produce(client, "no-such-topic", {0: build_batch([b"x"])}, acks=0)
    assert client.is_closed()
    other = live_broker.client()
    assert other.request(ApiVersionsRequestV0()).error_code == ErrorCode.none


def test_long_poll_woken_by_append(live_broker):
    consumer, producer = live_broker.client(), live_broker.client()
    create_topic(consumer, "poll")
    # max_wait far beyond the socket timeout: only an append can complete this fetch in time.
    consumer.send(fetch_v11.FetchRequest(
        max_wait=120_000 * MS, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch_v11.FetchTopic(topic="poll", partitions=(
            fetch_v11.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id=""))
    wait_until(lambda: live_broker.broker.appends.waiting_on(("poll", 0)) > 0, what="the fetch to park",
               timeout_s=10.0, interval_s=0.01)
    produce(producer, "poll", {0: build_batch([b"wake"])})
    consumer.sock.settimeout(30)
    _, response = consumer.receive(1, 11)
    assert values_of(response.responses[0].partitions[0].records) == [b"wake"]


def test_fetch_at_end_waits_then_answers_empty(live_broker):
    client = live_broker.client()
    create_topic(client, "idle")
    response = fetch(client, "idle", {0: 0}, max_wait_ms=100)
    partition = response.responses[0].partitions[0]
    assert partition.error_code == ErrorCode.none and partition.records in (b"", None) and partition.high_watermark == 0


def test_min_one_message_and_partition_limits(live_broker):
    client = live_broker.client()
    create_topic(client, "big", 2)
    large = build_batch([b"L" * 2000])
    produce(client, "big", {0: large, 1: large})
    produce(client, "big", {0: build_batch([b"small"])})
    # partition_max_bytes far below the batch: the first batch still comes back whole (KIP-74)...
    partitions = fetch(client, "big", {0: 0, 1: 0}, partition_max_bytes=100).responses[0].partitions
    assert values_of(partitions[0].records) == [b"L" * 2000]
    assert len(partitions[0].records) == len(large)
    # ...but only for the first partition with data; the next one's batch does not fit and stays behind.
    assert partitions[1].records in (b"", None) and partitions[1].high_watermark == 1
    # Response budget: max_bytes spent by the first partition, the second gets nothing.
    partitions = fetch(client, "big", {1: 0, 0: 1}, max_bytes=10).responses[0].partitions
    assert values_of(partitions[0].records) == [b"L" * 2000] and partitions[1].records in (b"", None)


def test_offset_out_of_range_and_unknown(live_broker):
    client = live_broker.client()
    create_topic(client, "range")
    produce(client, "range", {0: build_batch([b"1", b"2"])})
    partition = fetch(client, "range", {0: 7}).responses[0].partitions[0]
    assert partition.error_code == ErrorCode.offset_out_of_range and partition.high_watermark == 2
    unknown = fetch(client, "nope", {0: 0}, module=fetch_v4).responses[0].partitions[0]
    assert unknown.error_code == ErrorCode.unknown_topic_or_partition


def test_list_offsets(live_broker):
    client = live_broker.client()
    create_topic(client, "times")
    produce(client, "times", {0: build_batch([b"a", b"b", b"c"], base_timestamp_ms=1000, timestamp_step_ms=10)})
    produce(client, "times", {0: build_batch([b"d"], base_timestamp_ms=5000)})

    def lookup(timestamp):
        item = list_offsets(client, "times", timestamp)
        return item.error_code, item.offset, item.timestamp

    assert lookup(-1) == (ErrorCode.none, 4, -1)
    assert lookup(-2) == (ErrorCode.none, 0, -1)
    assert lookup(1005) == (ErrorCode.none, 1, 1010)  # per record, inside the first batch
    assert lookup(1021) == (ErrorCode.none, 3, 5000)
    assert lookup(9999) == (ErrorCode.none, -1, -1)


def test_idempotent_producer_dedup_and_gap_survive_restart(inproc_factory, tmp_path):
    live = inproc_factory("uvloop")
    client = live.client()
    create_topic(client, "idem")
    init = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout=60_000 * MS))
    pid = init.producer_id
    assert init.error_code == ErrorCode.none and pid >= 0

    def send(sequence, values, target=client):
        batch = build_batch(values, producer_id=pid, producer_epoch=0, base_sequence=sequence)
        item = produce(target, "idem", {0: batch}, acks=-1).responses[0].partition_responses[0]
        return item.error_code, item.base_offset

    assert send(0, [b"a", b"b"]) == (ErrorCode.none, 0)
    assert send(2, [b"c"]) == (ErrorCode.none, 2)
    assert send(0, [b"a", b"b"]) == (ErrorCode.none, 0)  # retry: original offset, not appended
    assert send(5, [b"gap"])[0] == ErrorCode.out_of_order_sequence_number
    live.stop()
    again = inproc_factory("asyncio")
    client2 = again.client()
    assert send(2, [b"c"], client2) == (ErrorCode.none, 2)  # dedup state rebuilt from the log
    assert send(3, [b"d"], client2) == (ErrorCode.none, 3)
    assert values_of(fetch(client2, "idem", {0: 0}).responses[0].partitions[0].records) == [b"a", b"b", b"c", b"d"]
    fresh = client2.request(InitProducerIdRequest(transactional_id=None, transaction_timeout=60_000 * MS))
    assert fresh.producer_id > pid  # never reused after a restart


def test_topics_persist_create_delete(inproc_factory):
    live = inproc_factory("uvloop")
    client = live.client()
    assert create_topic(client, "keep", 3, configs=[("retention.ms", "3600000")]).error_code == ErrorCode.none
    assert create_topic(client, "keep").error_code == ErrorCode.topic_already_exists
    assert create_topic(client, "ke_ep").error_code == ErrorCode.none
    assert create_topic(client, "ke.ep").error_code == ErrorCode.invalid_topic_exception
    assert create_topic(client, "bad", configs=[("cleanup.policy", "shred")]).error_code == ErrorCode.invalid_config
    assert create_topic(client, "zero", 0).error_code == ErrorCode.invalid_partitions
    produce(client, "keep", {2: build_batch([b"persisted"])})
    deleted = client.request(DeleteTopicsRequest(topic_names=("ke_ep", "never"), timeout=1000 * MS))
    assert [r.error_code for r in deleted.responses] == [ErrorCode.none, ErrorCode.unknown_topic_or_partition]
    live.stop()
    again = inproc_factory("uvloop")
    client = again.client()
    names = {t.name: len(t.partitions) for t in client.request(metadata_v1.MetadataRequest(topics=None)).topics
             if not t.is_internal}
    assert names == {"keep": 3}
    assert again.broker.replicas.get("keep", 0).log.config.retention_ms == 3600_000
    assert values_of(fetch(client, "keep", {2: 0}).responses[0].partitions[0].records) == [b"persisted"]


def test_offset_for_leader_epoch(live_broker):
    client = live_broker.client()
    create_topic(client, "epochs")
    produce(client, "epochs", {0: build_batch([b"1", b"2", b"3"])})

    def ask(leader_epoch, current=-1):
        response = client.request(epoch_v2.OffsetForLeaderEpochRequest(topics=(epoch_v2.OffsetForLeaderTopic(
            topic="epochs", partitions=(epoch_v2.OffsetForLeaderPartition(
                partition=0, current_leader_epoch=current, leader_epoch=leader_epoch),)),)))
        item = response.topics[0].partitions[0]
        return item.error_code, item.leader_epoch, item.end_offset

    assert ask(0) == (ErrorCode.none, 0, 3)
    assert ask(4) == (ErrorCode.none, -1, -1)
    assert ask(0, current=2)[0] == ErrorCode.unknown_leader_epoch


@pytest.mark.parametrize("payload", [
    struct.pack(">i", 200 * 1024 * 1024),            # over socket.request.max.bytes
    struct.pack(">i", -5),                           # negative size
    struct.pack(">ihhih", 10, 999, 0, 1, -1),         # unknown API key
    struct.pack(">ihhihi", 14, 3, 1, 1, -1, 5),       # Metadata v1 announcing 5 topics, carrying none
])
def test_bad_input_closes_only_that_connection(live_broker, payload):
    bad = live_broker.client()
    bad.sock.sendall(payload)
    assert bad.is_closed()
    good = live_broker.client()
    assert good.request(ApiVersionsRequestV0()).error_code == ErrorCode.none
    assert live_broker.stats.connections_closed_on_error >= 1


def test_sync_flush_mode_acks_all_waits_for_fdatasync(inproc_factory):
    live = inproc_factory("uvloop", flush_mode="sync")
    client = live.client()
    create_topic(client, "durable")
    for n in range(3):
        item = produce(client, "durable", {0: build_batch([b"d%d" % n] * 10)},
                       acks=-1).responses[0].partition_responses[0]
        assert item.error_code == ErrorCode.none
        # Acknowledged under the sync mode means on disk.
        assert live.broker.replicas.get("durable", 0).log.flushed_offset >= item.base_offset + 10


def test_log_append_time_topic(live_broker):
    client = live_broker.client()
    create_topic(client, "lat", configs=[("message.timestamp.type", "LogAppendTime")])
    before_ms = int(time.time() * 1000)
    item = produce(client, "lat", {0: build_batch([b"a", b"b"], base_timestamp_ms=1000)}
                   ).responses[0].partition_responses[0]
    assert item.error_code == ErrorCode.none
    append_ms = int(item.log_append_time.timestamp() * 1000)
    assert append_ms >= before_ms
    records = fetch(client, "lat", {0: 0}).responses[0].partitions[0].records
    header = list(iter_batches(records))[0][1]
    assert header.is_log_append_time and header.max_timestamp == append_ms
    assert [r.timestamp for r in decode_records(records, 0)] == [append_ms, append_ms]


def test_kafka_python_idempotent_round_trip(live_broker):
    kafka = pytest.importorskip("kafka")
    bootstrap = f"127.0.0.1:{live_broker.port}"
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap)  # idempotent, acks=all by default
    futures = [producer.send("kp", key=b"k", value=b"v%d" % n) for n in range(20)]
    producer.flush(30)
    assert [f.get(30).offset for f in futures] == list(range(20))
    producer.close(10)
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=5000, auto_offset_reset="earliest")
    partition = kafka.TopicPartition("kp", 0)
    consumer.assign([partition])
    consumer.seek(partition, 5)
    values = [message.value for message in consumer]
    consumer.close()
    assert values == [b"v%d" % n for n in range(5, 20)]
    assert live_broker.stats.produce_batches >= 1 and live_broker.broker.producers.producer_count() == 1


def test_graceful_shutdown_answers_parked_fetch_and_marks_clean(inproc_factory, tmp_path):
    import threading

    live = inproc_factory("uvloop")
    client = live.client()
    create_topic(client, "bye")
    produce(client, "bye", {0: build_batch([b"kept"])})
    client.send(fetch_v11.FetchRequest(
        max_wait=120_000 * MS, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch_v11.FetchTopic(topic="bye", partitions=(
            fetch_v11.FetchPartition(partition=0, fetch_offset=1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id=""))
    wait_until(lambda: live.broker.appends.waiting_on(("bye", 0)) == 1, what="the fetch to park", timeout_s=10.0,
               interval_s=0.005)
    stopper = threading.Thread(target=live.stop)
    stopper.start()
    # The in-flight long poll is answered (empty) before the connection closes.
    _, response = client.receive(1, 11)
    assert response.responses[0].partitions[0].high_watermark == 1
    assert client.is_closed()
    stopper.join(60)
    assert (tmp_path / "data" / ".copyless_cleanshutdown").exists()
    again = inproc_factory("asyncio")
    assert values_of(fetch(again.client(), "bye", {0: 0}).responses[0].partitions[0].records) == [b"kept"]


def test_create_topics_validate_only_defaults_and_assignments(live_broker):
    client = live_broker.client()

    def create(topic, validate_only=False):
        response = client.request(create_v4.CreateTopicsRequest(topics=(topic,), timeout=1000 * MS,
                                                                validate_only=validate_only))
        return response.topics[0]

    plain = dict(replication_factor=-1, assignments=(), configs=())
    dry = create(create_v4.CreatableTopic(name="dry", num_partitions=3, **plain), validate_only=True)
    assert dry.error_code == ErrorCode.none
    assert live_broker.broker.topic("dry") is None  # validated, not created
    assert create(create_v4.CreatableTopic(name="dflt", num_partitions=-1, **plain)).error_code == ErrorCode.none
    assert live_broker.broker.topic("dflt").partitions == 1  # num.partitions
    replicated = create(create_v4.CreatableTopic(name="rf3", num_partitions=1, replication_factor=3, assignments=(),
                                                 configs=()))
    assert replicated.error_code == ErrorCode.invalid_replication_factor and "1 broker" in replicated.error_message
    on_zero = tuple(create_v4.CreatableReplicaAssignment(partition_index=index, broker_ids=(0,)) for index in (0, 1))
    assigned = create(create_v4.CreatableTopic(name="manual", num_partitions=-1, replication_factor=-1, configs=(),
                                               assignments=on_zero))
    assert assigned.error_code == ErrorCode.none and live_broker.broker.topic("manual").partitions == 2
    elsewhere = create(create_v4.CreatableTopic(name="elsewhere", num_partitions=-1, replication_factor=-1, configs=(),
                                                assignments=(create_v4.CreatableReplicaAssignment(partition_index=0,
                                                                                                  broker_ids=(7,)),)))
    assert elsewhere.error_code == ErrorCode.invalid_replica_assignment

    async def create_internal():
        return await live_broker.broker.create_topic("__internal_state", 1, internal=True)

    live_broker.call(create_internal)
    internal = client.request(DeleteTopicsRequest(topic_names=("__internal_state",), timeout=1000 * MS)).responses[0]
    assert internal.error_code == ErrorCode.invalid_topic_exception
    assert live_broker.broker.topic("__internal_state").internal


def test_describe_configs(live_broker):
    from kio.schema.describe_configs.v2 import request as describe_v2

    client = live_broker.client()
    create_topic(client, "conf", configs=[("retention.ms", "60000"), ("cleanup.policy", "delete")])
    response = client.request(describe_v2.DescribeConfigsRequest(include_synonyms=True, resources=(
        describe_v2.DescribeConfigsResource(resource_type=2, resource_name="conf", configuration_keys=None),
        describe_v2.DescribeConfigsResource(resource_type=2, resource_name="absent", configuration_keys=None),
        describe_v2.DescribeConfigsResource(resource_type=4, resource_name="0", configuration_keys=("num.partitions",)),
    )))
    topic, absent, broker = response.results
    configs = {c.name: c for c in topic.configs}
    assert configs["retention.ms"].value == "60000" and configs["retention.ms"].config_source == 1
    assert [s.value for s in configs["retention.ms"].synonyms] == ["60000", str(7 * 24 * 3600 * 1000)]
    assert configs["max.message.bytes"].value == "1048588" and configs["max.message.bytes"].config_source == 5
    assert absent.error_code == ErrorCode.unknown_topic_or_partition
    assert [(c.name, c.value) for c in broker.configs] == [("num.partitions", "1")]


def test_idle_connections_are_closed(inproc_factory):
    live = inproc_factory("asyncio", connections_max_idle_ms=1500)
    idle = live.client()
    assert idle.request(ApiVersionsRequestV0()).error_code == ErrorCode.none
    assert idle.is_closed(timeout_s=20)
    active = live.client()
    # A connection that keeps sending requests stays open (each request resets its idle clock).
    for _ in range(5):
        assert active.request(ApiVersionsRequestV0()).error_code == ErrorCode.none
        time.sleep(0.05)


def test_accepted_connections_get_the_configured_socket_buffers(inproc_factory):
    live = inproc_factory("asyncio", socket_send_buffer_bytes=48 * 1024, socket_receive_buffer_bytes=40 * 1024)
    client = live.client()
    assert client.request(ApiVersionsRequestV0()).error_code == ErrorCode.none
    [(connection, _task)] = live.server.connections.values()
    # Linux reports twice the value set: the other half is its bookkeeping allowance (socket(7)).
    assert connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * 48 * 1024
    assert connection.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 40 * 1024
    assert connection.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_undecodable_batch_does_not_break_timestamp_lookup(live_broker):
    client = live_broker.client()
    create_topic(client, "garbage")
    # Valid header and CRC, records that are not records: accepted (produce never decodes records).
    bad = frame_batch(b"\xff" * 40, records_count=3, base_timestamp_ms=1000, max_timestamp_ms=1002)
    assert produce(client, "garbage", {0: bad}).responses[0].partition_responses[0].error_code == ErrorCode.none
    produce(client, "garbage", {0: build_batch([b"good"], base_timestamp_ms=5000)})

    def lookup(timestamp):
        item = list_offsets(client, "garbage", timestamp)
        return item.error_code, item.offset

    assert lookup(1001) == (ErrorCode.corrupt_message, -1)
    assert lookup(4000) == (ErrorCode.none, 3)  # same connection, still served


def test_producer_state_rebuilt_from_recent_segments_only(inproc_factory):
    from copyless.broker.producer_state import producer_state_scan_start

    live = inproc_factory("uvloop")
    client = live.client()
    create_topic(client, "segs", configs=[("segment.bytes", "4096")])
    pid = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout=60_000 * MS)).producer_id
    batches = [build_batch([b"r%03d" % n + b"." * 500], producer_id=pid, producer_epoch=0, base_sequence=n)
               for n in range(30)]
    for n, batch in enumerate(batches):
        assert produce(client, "segs", {0: batch}, acks=-1).responses[0].partition_responses[0].base_offset == n
    live.stop()
    again = inproc_factory("asyncio")
    partition_log = again.broker.replicas.get("segs", 0).log
    bases = partition_log.segment_base_offsets()
    assert len(bases) >= 4 and producer_state_scan_start(partition_log) == bases[-2] > 0
    client = again.client()
    # The last batch (in the newest segments) is still recognised as a retry after the restart.
    retry = produce(client, "segs", {0: batches[-1]}, acks=-1).responses[0].partition_responses[0]
    assert (retry.error_code, retry.base_offset) == (ErrorCode.none, 29)
    assert again.broker.replicas.get("segs", 0).log.log_end_offset == 30


def test_registry_reconciles_with_log_directories(inproc_factory, tmp_path):
    import json

    live = inproc_factory("uvloop")
    client = live.client()
    create_topic(client, "kept", 2)
    create_topic(client, "orphan")
    produce(client, "kept", {1: build_batch([b"k"])})
    live.stop()
    registry = tmp_path / "data" / "topics.json"
    # A crash between "logs created" and "registry written" leaves logs the registry does not list.
    data = json.loads(registry.read_text())
    data["topics"] = [t for t in data["topics"] if t["name"] != "orphan"]
    registry.write_text(json.dumps(data))
    again = inproc_factory("uvloop")
    assert again.broker.topic("orphan") is None and again.broker.log_manager.get_log("orphan", 0) is None
    assert not (tmp_path / "data" / "orphan-0").exists()
    again.stop()
    # A lost registry file adopts the log directories instead of deleting data.
    registry.unlink()
    third = inproc_factory("asyncio")
    kept = third.broker.topic("kept")
    assert kept is not None and kept.partitions == 2
    assert values_of(fetch(third.client(), "kept", {1: 0}).responses[0].partitions[0].records) == [b"k"]
    assert registry.exists()


def test_delete_then_recreate_at_once_starts_empty(live_broker):
    client = live_broker.client()
    create_topic(client, "again", 2)
    produce(client, "again", {0: build_batch([b"old"] * 5)})
    # Both requests in one write: the create is handled right after the delete returns.
    client.sock.sendall(
        client.frame(DeleteTopicsRequest(topic_names=("again",), timeout=1000 * MS))
        + client.frame(create_v4.CreateTopicsRequest(topics=(create_v4.CreatableTopic(
            name="again", num_partitions=1, replication_factor=1, assignments=(), configs=()),),
            timeout=1000 * MS, validate_only=False))
    )
    assert client.receive(20, 3)[1].responses[0].error_code == ErrorCode.none
    assert client.receive(19, 4)[1].topics[0].error_code == ErrorCode.none
    partition = fetch(client, "again", {0: 0}).responses[0].partitions[0]
    assert partition.high_watermark == 0 and partition.records in (b"", None)
    assert live_broker.broker.topic("again").partitions == 1


def test_concurrent_delete_and_create_leave_a_consistent_topic(live_broker):
    deleter, creator = live_broker.client(), live_broker.client()
    for _round in range(5):
        create_topic(deleter, "race", 2)
        produce(deleter, "race", {0: build_batch([b"old"])})
        deleter.send(DeleteTopicsRequest(topic_names=("race",), timeout=1000 * MS))
        created = create_topic(creator, "race", 1)
        assert deleter.receive(20, 3)[1].responses[0].error_code == ErrorCode.none
        assert created.error_code in (ErrorCode.none, ErrorCode.topic_already_exists)
        topic = live_broker.broker.topic("race")
        if created.error_code == ErrorCode.none:
            # Created after the delete: a fresh, empty, writable log.
            assert topic.partitions == 1 and live_broker.broker.replicas.get("race", 0).log is not None
            item = produce(creator, "race", {0: build_batch([b"new"])}).responses[0].partition_responses[0]
            assert (item.error_code, item.base_offset) == (ErrorCode.none, 0)
            deleter.request(DeleteTopicsRequest(topic_names=("race",), timeout=1000 * MS))
        else:
            assert topic is None
