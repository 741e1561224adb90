"""``copyless groups list|describe`` against a live group, and offset expiry (offsets.retention) end to end."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.offset_commit.v2 import request as oc_rq
from kio.schema.offset_commit.v2 import response as oc_rs
from kio.schema.offset_fetch.v3 import request as of_rq
from kio.schema.offset_fetch.v3 import response as of_rs
from kio.static.primitive import i32Timedelta

from copyless.client.blocking import BlockingClient as GroupsClient
from tests.support.groups import GROUP_CONFIG, create_topic, produce
from tests.support.polling import gather, wait_until


def copyless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "copyless.broker", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(120)
def test_groups_cli_lists_and_describes_a_live_group(broker_factory, tmp_path):
    config = tmp_path / "groups.toml"
    config.write_text(GROUP_CONFIG)
    broker = broker_factory(extra_args=("--config", str(config)))
    create_topic(broker.bootstrap, "cli-topic", 2)
    produce(broker.bootstrap, "cli-topic", 2, "x", 10)
    consumer = KafkaConsumer("cli-topic", bootstrap_servers=broker.bootstrap, group_id="cli-group",
                             enable_auto_commit=False, auto_offset_reset="earliest", client_id="cli-client",
                             session_timeout_ms=6000, heartbeat_interval_ms=300)
    try:
        got = gather(lambda: [r for rs in consumer.poll(timeout_ms=200).values() for r in rs], count=20, timeout_s=30)
        assert len(got) == 20
        consumer.commit({TopicPartition("cli-topic", 0): OffsetAndMetadata(4, "", -1),
                         TopicPartition("cli-topic", 1): OffsetAndMetadata(10, "", -1)})
        listed = copyless("groups", "list", "--bootstrap", broker.bootstrap, "--json")
        assert listed.returncode == 0, listed.stderr
        assert {"group": "cli-group", "protocol_type": "consumer"} in json.loads(listed.stdout)

        consumer.poll(timeout_ms=100)  # keep the member's session alive
        described = copyless("groups", "describe", "cli-group", "--bootstrap", broker.bootstrap, "--json")
        assert described.returncode == 0, described.stderr
        info = json.loads(described.stdout)
        assert info["state"] == "Stable" and len(info["members"]) == 1
        member = info["members"][0]
        assert member["client_id"] == "cli-client"
        assert sorted(member["assignment"]) == ["cli-topic-0", "cli-topic-1"]
        rows = {(r["topic"], r["partition"]): r for r in info["partitions"]}
        assert rows[("cli-topic", 0)]["committed_offset"] == 4 and rows[("cli-topic", 0)]["lag"] == 6
        assert rows[("cli-topic", 1)]["lag"] == 0 and rows[("cli-topic", 1)]["log_end_offset"] == 10
        assert rows[("cli-topic", 0)]["member_id"] == member["member_id"]

        text = copyless("groups", "describe", "cli-group", "--bootstrap", broker.bootstrap)
        assert text.returncode == 0 and "state Stable" in text.stdout and "LAG" in text.stdout

        # Admin clients see the same through ListGroups / DescribeGroups (librdkafka here).
        from confluent_kafka import ConsumerGroupState
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        listed_ids = {g.group_id for g in admin.list_consumer_groups().result(timeout=30).valid}
        assert "cli-group" in listed_ids
        group = admin.describe_consumer_groups(["cli-group"])["cli-group"].result(timeout=30)
        assert group.state == ConsumerGroupState.STABLE and group.partition_assignor == "range"
        assert [m.client_id for m in group.members] == ["cli-client"]
        assert sorted(tp.partition for tp in group.members[0].assignment.topic_partitions) == [0, 1]
    finally:
        consumer.close()
    unknown = copyless("groups", "describe", "no-such-group", "--bootstrap", broker.bootstrap, "--json")
    # Kafka describes a group it does not know as Dead and empty; the CLI says it does not exist.
    assert unknown.returncode == 1, unknown.stderr
    assert json.loads(unknown.stdout) == {"error": "GROUP_ID_NOT_FOUND", "code": 69,
                                          "message": "group 'no-such-group' does not exist"}
    down = copyless("groups", "list", "--bootstrap", "127.0.0.1:1")
    assert down.returncode == 1 and "copyless groups list" in down.stderr


def commit_standalone(client: GroupsClient, group: str, topic: str, offset: int) -> ErrorCode:
    response = client.request(oc_rq.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="",
        retention_time=i32Timedelta.parse(datetime.timedelta(milliseconds=-1)),
        topics=(oc_rq.OffsetCommitRequestTopic(name=topic, partitions=(
            oc_rq.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                               committed_metadata="m"),)),),
    ), oc_rs.OffsetCommitResponse)
    return response.topics[0].partitions[0].error_code


def fetch_offset(client: GroupsClient, group: str, topic: str) -> int:
    """The group's committed offset. Right after a restart the coordinator may still be replaying
    __consumer_offsets and answers COORDINATOR_LOAD_IN_PROGRESS, which Kafka clients retry; so does this
    (for up to 10 s). Any other error fails the test."""

    def loaded():
        response = client.request(of_rq.OffsetFetchRequest(group_id=group, topics=(
            of_rq.OffsetFetchRequestTopic(name=topic, partition_indexes=(0,)),)), of_rs.OffsetFetchResponse)
        return None if response.error_code == ErrorCode.coordinator_load_in_progress else response

    response = wait_until(loaded, what=f"the coordinator to load group {group}", timeout_s=10.0, interval_s=0.1)
    assert response.error_code == ErrorCode.none
    return response.topics[0].partitions[0].committed_offset


@pytest.mark.timeout(120)
def test_offsets_expire_after_retention_and_stay_expired_after_restart(broker_factory, tmp_path):
    config = tmp_path / "expiry.toml"
    config.write_text(GROUP_CONFIG + '"offsets.retention.ms" = 3000\n"offsets.retention.check.interval.ms" = 200\n')
    broker = broker_factory(extra_args=("--config", str(config)))
    create_topic(broker.bootstrap, "exp-topic", 1)
    host, port = broker.bootstrap.rsplit(":", 1)
    with GroupsClient(host, int(port)) as client:
        assert commit_standalone(client, "keep-fresh", "exp-topic", 7) == ErrorCode.none
        assert commit_standalone(client, "old", "exp-topic", 5) == ErrorCode.none
        assert commit_standalone(client, "bad", "no-such-topic", 5) == ErrorCode.unknown_topic_or_partition
        assert fetch_offset(client, "old", "exp-topic") == 5
        # Recommitting restarts the clock of a standalone group's offset.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert commit_standalone(client, "keep-fresh", "exp-topic", 7) == ErrorCode.none
            time.sleep(0.5)
        assert fetch_offset(client, "old", "exp-topic") == -1
        assert fetch_offset(client, "keep-fresh", "exp-topic") == 7
    wait_until(lambda: "expired" in broker.log_text(), what="the expiry log line", timeout_s=10.0, interval_s=0.1)
    broker.restart("kill")
    with GroupsClient(host, int(port)) as client:
        assert fetch_offset(client, "old", "exp-topic") == -1, "the tombstone must survive a restart"
