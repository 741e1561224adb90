"""Code the test folders share: how tests build what they send, talk to brokers and wait for them.

Tests import it as ``from tests.support.<module> import <name>`` (or ``from tests.support import <module>``
for a module used by name, ``wire.fetch_v4``); a test module never imports another test module, and
fixtures stay in the conftest files. Nothing here may depend on the code under test where a bug in that
code could hide in the test too: the batch codec and the hand-written protocol import no copyless module.

    batches          RecordBatch v2 encoder (build_batch, keyed_batch, idempotent_batch, frame_batch,
                     restamp_crc) and reader (batch_headers, records_of, values_of); codec ids.
    wire             hand-encoded requests and responses (Metadata v1, Produce v3, Fetch v4, ...),
                     RawConnection, and the raw-protocol steps: ensure_topic, wait_fetchable, produce_one,
                     high_watermark, fetch_all, init_producer_id, health_check.
    kio_requests     KafkaWire (kio entities over a blocking socket) and create_topic / produce / fetch /
                     list_offsets.
    polling          wait_until(condition, what=, timeout_s=): the one polling loop.
    topics           unique_topic(prefix); create_topic(bootstrap, topic, partitions, config) through librdkafka.
    read_back        a topic read back: read_back + assert_exactly_once (copyless's consumer),
                     read_partition_to_end and read_topic_to_end (librdkafka's, the latter per isolation level).
    broker_process   BrokerProcess (a ``copyless serve`` subprocess), TEST_BROKER_CONFIG, external brokers.
    live_broker      LiveBroker: an in-process broker on its own loop thread, for its counters.
    blocking_appends append_blocking, append_as_follower_blocking, roll_blocking: a PartitionLog's appends
                     and roll, waiting for its worker threads (storage tests, benchmarks).
    log_reads        read_records(partition_log): a PartitionLog's records through its own reads, start to end.
    log_configs      SMALL: the small-segment LogConfig of the storage and transaction tests (and of the
                     scenario processes they start).
    clients          one driver per real Kafka client (DRIVERS), Rec, make_records, assert_same_records.
    groups           consumer groups: a broker with fast group timings, Member processes
                     (group_member.py), their events, the coordinator's load.
    subprocesses     REPO_ROOT and python_env() for child processes that run this checkout.
    tmpfs            mounted_tmpfs(): a small real filesystem for full-disk tests; take_every_free_byte().
    (fixtures)       the one etcd (``etcd_server``, session-scoped) and ``manager_factory`` (LogManagers on
                     SMALL) are in tests/conftest.py.
    power_loss       lose_unflushed(), in_another_boot(): a simulated power loss of one broker.
    nemesis          faults that start and heal, the stage they run on, a seeded overlapping schedule.
    kafka_workload   the fault tests' producer, poller and group, and the History they leave.
    checker          the pure checker of a History: Jepsen's Kafka workload anomalies.
    jepsen           one run: workload + nemesis + heal + read back + check (suite and soak).
"""
