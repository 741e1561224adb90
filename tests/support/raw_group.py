"""One consumer-group member speaking the group protocol as raw requests over a plain socket, so a test
decides exactly when it joins, syncs and heartbeats, and to which broker (a real client would rediscover
the coordinator on its own schedule). kio builds the requests; ``copyless.client.blocking`` sends them."""

from __future__ import annotations

import datetime

from kio.schema.describe_groups.v4 import request as dg_rq
from kio.schema.describe_groups.v4 import response as dg_rs
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2 import request as fc_rq
from kio.schema.find_coordinator.v2 import response as fc_rs
from kio.schema.heartbeat.v3 import request as hb_rq
from kio.schema.heartbeat.v3 import response as hb_rs
from kio.schema.join_group.v5 import request as jg_rq
from kio.schema.join_group.v5 import response as jg_rs
from kio.schema.sync_group.v3 import request as sg_rq
from kio.schema.sync_group.v3 import response as sg_rs
from kio.static.primitive import i32Timedelta

from copyless.client.blocking import BlockingClient

__all__ = ["RawMember", "find_coordinator", "describe_group"]


def ms(value: int):
    return i32Timedelta.parse(datetime.timedelta(milliseconds=value))


def _client(bootstrap: str, timeout_s: float) -> BlockingClient:
    host, port = bootstrap.rsplit(":", 1)
    return BlockingClient(host, int(port), timeout_s=timeout_s)


def find_coordinator(bootstrap: str, group: str) -> tuple[int, int]:
    """(error code, node id) of FindCoordinator for ``group`` asked at ``bootstrap``."""
    with _client(bootstrap, 10) as client:
        response = client.request(fc_rq.FindCoordinatorRequest(key=group, key_type=0), fc_rs.FindCoordinatorResponse)
    return response.error_code, response.node_id


def describe_group(bootstrap: str, group: str):
    """DescribeGroups v4 for ``group`` at ``bootstrap``: the described group (error code, state, members
    with their assignments)."""
    with _client(bootstrap, 10) as client:
        response = client.request(dg_rq.DescribeGroupsRequest(groups=(group,), include_authorized_operations=False),
                                  dg_rs.DescribeGroupsResponse)
    return response.groups[0]


class RawMember:
    def __init__(self, bootstrap: str, group: str, *, timeout_s: float = 30.0) -> None:
        self.group = group
        self.client = _client(bootstrap, timeout_s)
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.assignment = b""

    def close(self) -> None:
        self.client.close()

    def join(self, *, session_ms: int = 6000, rebalance_ms: int = 3000):
        """JoinGroup, retried once with the member id MEMBER_ID_REQUIRED hands out. Returns the response."""
        for _ in range(2):
            response = self.client.request(jg_rq.JoinGroupRequest(
                group_id=self.group, session_timeout=ms(session_ms), rebalance_timeout=ms(rebalance_ms),
                member_id=self.member_id, group_instance_id=None, protocol_type="consumer",
                protocols=(jg_rq.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x00"),),
            ), jg_rs.JoinGroupResponse)
            if response.error_code in (ErrorCode.none, ErrorCode.member_id_required):
                self.member_id = response.member_id
            if response.error_code != ErrorCode.member_id_required:
                break
        if response.error_code == ErrorCode.none:
            self.generation = response.generation_id
            self.leader = response.leader
        return response

    def sync(self, assignments=()) -> int:
        """SyncGroup (the leader passes ``assignments``: (member id, bytes)). Returns the error code."""
        response = self.client.request(sg_rq.SyncGroupRequest(
            group_id=self.group, generation_id=self.generation, member_id=self.member_id, group_instance_id=None,
            assignments=tuple(sg_rq.SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in assignments),
        ), sg_rs.SyncGroupResponse)
        if response.error_code == ErrorCode.none:
            self.assignment = bytes(response.assignment)
        return response.error_code

    def heartbeat(self) -> int:
        return self.client.request(hb_rq.HeartbeatRequest(
            group_id=self.group, generation_id=self.generation, member_id=self.member_id, group_instance_id=None,
        ), hb_rs.HeartbeatResponse).error_code
