"""``copyless groups list`` and ``copyless groups describe GROUP``: consumer groups of a running broker.

Talks the Kafka protocol to any broker (copyless or Kafka) through a minimal blocking client defined here:
ListGroups v2, FindCoordinator v1, DescribeGroups v4, OffsetFetch v5 (all committed offsets of the group)
and ListOffsets v2 (log end offsets), with kio codecs. ``describe`` prints what Kafka's
``kafka-consumer-groups.sh --describe`` prints: the group's state and, per partition with a committed offset
or an owner, the committed offset, the log end offset, the lag and the owning member; ``--json`` prints the
same as one JSON document.
"""

from __future__ import annotations

import io
import json
import socket
import struct
import sys
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

__all__ = ["add_parsers", "GroupsClient", "describe_group", "list_groups"]

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")
CLIENT_ID = "copyless-groups"
MAX_RESPONSE_BYTES = 100 * 1024 * 1024


class GroupsError(RuntimeError):
    pass


class GroupsClient:
    """One blocking connection; one request in flight at a time (responses therefore in order)."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, request_entity, response_type):
        """Send a non-flexible request (header v1) and decode its response (header v0)."""
        self.correlation_id += 1
        body = io.BytesIO()
        entity_writer(type(request_entity))(body, request_entity)
        client_id = CLIENT_ID.encode()
        header = _HEADER.pack(request_entity.__api_key__, request_entity.__version__, self.correlation_id) \
            + struct.pack(">h", len(client_id)) + client_id
        frame = header + body.getvalue()
        self.sock.sendall(_SIZE.pack(len(frame)) + frame)
        (size,) = _SIZE.unpack(self._read_exactly(4))
        if not 4 <= size <= MAX_RESPONSE_BYTES:
            raise GroupsError(f"bad response size {size}")
        payload = self._read_exactly(size)
        (correlation_id,) = _SIZE.unpack_from(payload, 0)
        if correlation_id != self.correlation_id:
            raise GroupsError(f"response for request {correlation_id}, expected {self.correlation_id}")
        entity, _size = entity_reader(response_type)(payload[4:], 0)
        return entity

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self.sock.recv(size - len(chunks))
            if not chunk:
                raise GroupsError("the broker closed the connection")
            chunks += chunk
        return bytes(chunks)


def _parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"copyless groups: expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _check(code, what: str) -> None:
    if code != ErrorCode.none:
        raise GroupsError(f"{what}: {ErrorCode(code).name.upper()} ({int(code)})")


# --- queries -----------------------------------------------------------------------------------------------


def list_groups(bootstrap: str) -> list[dict[str, str]]:
    from kio.schema.list_groups.v2 import request as rq, response as rs

    with GroupsClient(*_parse_address(bootstrap)) as client:
        response = client.request(rq.ListGroupsRequest(), rs.ListGroupsResponse)
    _check(response.error_code, "ListGroups")
    return [{"group": g.group_id, "protocol_type": g.protocol_type} for g in response.groups]


def _decode_assignment(data: bytes) -> list[tuple[str, int]]:
    """A consumer-protocol assignment: int16 version, then ConsumerProtocolAssignment of that version."""
    if len(data) < 2:
        return []
    from kio.schema.consumer_protocol_assignment.v0 import data as v0

    # Every version (0-3) starts with v0's fields and only appends, so the v0 reader reads any of them
    # (Kafka's ConsumerProtocol reads newer versions the same way). The int16 version is skipped.
    try:
        assignment, _ = entity_reader(v0.ConsumerProtocolAssignment)(data[2:], 0)
    except Exception:  # not the consumer protocol's format: show no assignment rather than fail
        return []
    return [(tp.topic, int(p)) for tp in assignment.assigned_partitions for p in tp.partitions]


def describe_group(bootstrap: str, group_id: str) -> dict[str, Any]:
    """State, members and per-partition committed offset, log end offset and lag of one group."""
    from kio.schema.describe_groups.v4 import request as dg_rq, response as dg_rs
    from kio.schema.find_coordinator.v1 import request as fc_rq, response as fc_rs
    from kio.schema.list_offsets.v2 import request as lo_rq, response as lo_rs
    from kio.schema.offset_fetch.v5 import request as of_rq, response as of_rs

    host, port = _parse_address(bootstrap)
    with GroupsClient(host, port) as client:
        found = client.request(fc_rq.FindCoordinatorRequest(key=group_id, key_type=0), fc_rs.FindCoordinatorResponse)
    _check(found.error_code, "FindCoordinator")
    with GroupsClient(found.host, found.port) as coordinator:
        described = coordinator.request(
            dg_rq.DescribeGroupsRequest(groups=(group_id,), include_authorized_operations=False),
            dg_rs.DescribeGroupsResponse,
        ).groups[0]
        _check(described.error_code, "DescribeGroups")
        fetched = coordinator.request(of_rq.OffsetFetchRequest(group_id=group_id, topics=None),
                                      of_rs.OffsetFetchResponse)
        _check(fetched.error_code, "OffsetFetch")

    owners: dict[tuple[str, int], dict] = {}
    members = []
    for m in described.members:
        assigned = _decode_assignment(m.member_assignment) if described.protocol_type == "consumer" else []
        members.append({"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id, "host": m.client_host,
                        "assignment": [f"{t}-{p}" for t, p in assigned]})
        for tp in assigned:
            owners[tp] = m
    committed: dict[tuple[str, int], int] = {}
    for topic in fetched.topics:
        for p in topic.partitions:
            if p.error_code == ErrorCode.none and p.committed_offset >= 0:
                committed[(topic.name, p.partition_index)] = p.committed_offset
    partitions = sorted(set(committed) | set(owners))
    end_offsets: dict[tuple[str, int], int] = {}
    if partitions:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = lo_rq.ListOffsetsRequest(
            replica_id=-1, isolation_level=0,
            topics=tuple(lo_rq.ListOffsetsTopic(name=topic, partitions=tuple(
                lo_rq.ListOffsetsPartition(partition_index=p, timestamp=-1) for p in ps))
                for topic, ps in by_topic.items()),
        )
        with GroupsClient(host, port) as client:
            listed = client.request(request, lo_rs.ListOffsetsResponse)
        for topic in listed.topics:
            for p in topic.partitions:
                if p.error_code == ErrorCode.none:
                    end_offsets[(topic.name, p.partition_index)] = p.offset
    rows = []
    for tp in partitions:
        owner = owners.get(tp)
        current, end = committed.get(tp), end_offsets.get(tp)
        rows.append({
            "topic": tp[0], "partition": tp[1], "committed_offset": current, "log_end_offset": end,
            "lag": end - current if current is not None and end is not None else None,
            "member_id": owner.member_id if owner else None, "host": owner.client_host if owner else None,
            "client_id": owner.client_id if owner else None,
        })
    return {"group": group_id, "state": described.group_state, "protocol_type": described.protocol_type,
            "protocol": described.protocol_data, "members": members, "partitions": rows}


# --- command line --------------------------------------------------------------------------------------------


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def _cmd_list(args) -> int:
    try:
        groups = list_groups(args.bootstrap)
    except (OSError, GroupsError) as exc:
        print(f"copyless groups list: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(groups))
    else:
        rows = [["GROUP", "PROTOCOL-TYPE"]] + [[g["group"], g["protocol_type"] or "-"] for g in groups]
        print(_table(rows))
    return 0


def _cmd_describe(args) -> int:
    try:
        info = describe_group(args.bootstrap, args.group)
    except (OSError, GroupsError) as exc:
        print(f"copyless groups describe: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"group {info['group']}: state {info['state']}, protocol {info['protocol'] or '-'} "
          f"({info['protocol_type'] or 'no group management'}), {len(info['members'])} member(s)")

    def show(value):
        return "-" if value is None else str(value)

    rows = [["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]]
    for r in info["partitions"]:
        rows.append([r["topic"], str(r["partition"]), show(r["committed_offset"]), show(r["log_end_offset"]),
                     show(r["lag"]), show(r["member_id"]), show(r["host"]), show(r["client_id"])])
    if len(rows) > 1:
        print()
        print(_table(rows))
    if info["members"]:
        print()
        rows = [["MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"]]
        for m in info["members"]:
            rows.append([m["member_id"], show(m["group_instance_id"]), m["client_id"], m["host"],
                         ",".join(m["assignment"]) or "-"])
        print(_table(rows))
    return 0


def add_parsers(subparsers) -> None:
    groups = subparsers.add_parser("groups", help="list and describe consumer groups of a running broker")
    commands = groups.add_subparsers(dest="groups_command", metavar="{list,describe}")
    commands.required = True
    common = {"default": "127.0.0.1:9092", "metavar": "HOST:PORT", "help": "a broker (default 127.0.0.1:9092)"}
    listing = commands.add_parser("list", help="every group the broker coordinates")
    listing.add_argument("--bootstrap", **common)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(func=_cmd_list)
    describe = commands.add_parser("describe", help="state, members, committed offsets and lag of a group")
    describe.add_argument("group")
    describe.add_argument("--bootstrap", **common)
    describe.add_argument("--json", action="store_true", help="print JSON")
    describe.set_defaults(func=_cmd_describe)
