"""``copyless topics | groups | cluster``: the admin commands, as rpk and kafka-*.sh have them, over ``Admin``.

    copyless topics list|create|delete|describe|alter-config|add-partitions ...
    copyless groups list|describe|reset-offsets|delete ...
    copyless cluster info

``groups describe`` prints what ``kafka-consumer-groups.sh --describe`` prints: the group's state and, per
partition with a committed offset or an owner, the committed offset, the log end offset, the lag and the
owning member; a group the coordinator does not know is GROUP_ID_NOT_FOUND (exit status 1). ``groups reset-offsets`` is
a dry run unless ``--execute`` (as kafka-consumer-groups): it prints the plan, current and new offset per partition, and
commits only with ``--execute``; the group must have no running members. ``--json`` prints each command's result as one
JSON document.
"""

from __future__ import annotations

import json

from copyless.client.cli_common import add_common, client_security, parse_time_ms, plural, run

__all__ = ["add_parsers"]

GROUP_ID_NOT_FOUND = 69


def add_parsers(subparsers) -> None:
    # --- topics
    topics = subparsers.add_parser("topics", help="list, create, delete, describe and change topics")
    actions = topics.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="topic names")
    add_common(listing)
    listing.add_argument("--internal", action="store_true", help="include internal topics (__consumer_offsets)")
    create = actions.add_parser("create", help="create topics")
    create.add_argument("names", nargs="+", metavar="TOPIC", help="topics to create")
    add_common(create)
    create.add_argument("--partitions", type=int, default=1, help="partitions per topic (default 1)")
    create.add_argument("--replication-factor", type=int, default=1, help="replicas per partition (default 1)")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a topic config, e.g. retention.ms=3600000 (repeatable)")
    create.add_argument("--if-not-exists", action="store_true", help="a topic that exists is not an error")
    delete = actions.add_parser("delete", help="delete topics")
    delete.add_argument("names", nargs="+", metavar="TOPIC", help="topics to delete")
    add_common(delete)
    delete.add_argument("--if-exists", action="store_true", help="a topic that does not exist is not an error")
    describe = actions.add_parser("describe", help="partitions, leaders, replicas, ISR, offsets and configs")
    describe.add_argument("names", nargs="*", metavar="TOPIC", help="topics (default: all)")
    add_common(describe)
    describe.add_argument("--all-configs", action="store_true",
                          help="print every config, not only those set on the topic")
    alter = actions.add_parser("alter-config", help="set or delete topic configs (others stay as they are)")
    alter.add_argument("name", metavar="TOPIC", help="the topic")
    add_common(alter)
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a config (repeatable)")
    alter.add_argument("--delete", action="append", default=[], metavar="KEY",
                       help="remove a config, back to the broker's default (repeatable)")
    grow = actions.add_parser("add-partitions", help="grow a topic to more partitions")
    grow.add_argument("name", metavar="TOPIC", help="the topic")
    add_common(grow)
    grow.add_argument("--total", type=int, required=True, help="the topic's partition count afterwards")
    for parser in (listing, create, delete, describe, alter, grow):
        parser.set_defaults(func=_run_topics, command_name=f"copyless topics {parser.prog.split()[-1]}")

    # --- groups
    groups = subparsers.add_parser("groups", help="list, describe, reset and delete consumer groups")
    commands = groups.add_subparsers(dest="groups_command", metavar="ACTION")
    commands.required = True
    glist = commands.add_parser("list", help="every group of the cluster")
    add_common(glist)
    gdescribe = commands.add_parser("describe", help="state, members, committed offsets and lag of a group")
    gdescribe.add_argument("group", help="the group id")
    add_common(gdescribe)
    reset = commands.add_parser(
        "reset-offsets", help="move a group's committed offsets (a dry run unless --execute)",
        description="Prints the plan; commits it only with --execute. The group must have no running members.")
    reset.add_argument("group", help="the group id")
    add_common(reset)
    reset.add_argument("--topic", action="append", default=[], metavar="TOPIC[:P,P...]",
                       help="the topic (all its partitions, or those listed); repeatable; default: every "
                            "partition the group has an offset for")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to each partition's log start offset")
    target.add_argument("--to-latest", action="store_true", help="to each partition's log end offset")
    target.add_argument("--to-offset", type=int, metavar="N", help="to offset N (clamped to the log)")
    target.add_argument("--to-datetime", metavar="MS|ISO-8601",
                        help="to the first record at or after this time (the end when there is none)")
    target.add_argument("--shift-by", type=int, metavar="N", help="by N from the committed offset (negative: back)")
    reset.add_argument("--execute", action="store_true", help="commit the new offsets (default: only print them)")
    gdelete = commands.add_parser("delete", help="delete groups (they must have no members)")
    gdelete.add_argument("groups", nargs="+", metavar="GROUP", help="group ids")
    add_common(gdelete)
    for parser in (glist, gdescribe, reset, gdelete):
        parser.set_defaults(func=_run_groups, command_name=f"copyless groups {parser.prog.split()[-1]}")

    # --- transactions
    transactions = subparsers.add_parser("transactions", help="list and describe transactional ids")
    txn_commands = transactions.add_subparsers(dest="transactions_command", metavar="ACTION")
    txn_commands.required = True
    tlist = txn_commands.add_parser("list", help="every transactional id of the cluster, its producer and state")
    add_common(tlist)
    tdescribe = txn_commands.add_parser("describe", help="a transactional id's state, epoch and partitions")
    tdescribe.add_argument("transactional_id", metavar="TRANSACTIONAL-ID", help="the transactional id")
    add_common(tdescribe)
    for parser in (tlist, tdescribe):
        parser.set_defaults(func=_run_transactions, command_name=f"copyless transactions {parser.prog.split()[-1]}")

    # --- cluster
    cluster = subparsers.add_parser("cluster", help="the cluster's id, controller and brokers")
    cluster_actions = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    cluster_actions.required = True
    info = cluster_actions.add_parser("info", help="cluster id, controller and brokers")
    add_common(info)
    info.set_defaults(func=_run_cluster, command_name="copyless cluster info")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)


def _show(value) -> str:
    return "-" if value is None else str(value)


def _key_values(items, option: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key:
            raise ValueError(f"{option} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


# --- topics -------------------------------------------------------------------------------------------------


def _run_topics(args) -> int:
    return run(args, _topics(args))


async def _topics(args) -> int:
    from copyless.client.admin import EARLIEST, LATEST, Admin

    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        if args.action == "list":
            names = await admin.list_topics(internal=args.internal)
            print(json.dumps(names) if args.json else "\n".join(names))
        elif args.action == "create":
            results = await admin.create_topics(
                args.names, num_partitions=args.partitions, replication_factor=args.replication_factor,
                configs=_key_values(args.config, "--config"), if_not_exists=args.if_not_exists)
            _report(args, "created", results)
        elif args.action == "delete":
            _report(args, "deleted", await admin.delete_topics(args.names, if_exists=args.if_exists))
        elif args.action == "alter-config":
            if not args.set and not args.delete:
                raise ValueError("nothing to change: give --set KEY=VALUE or --delete KEY")
            changes = _key_values(args.set, "--set")
            await admin.alter_configs(args.name, set=changes, delete=args.delete)
            result = {"topic": args.name, "set": changes, "deleted": list(args.delete)}
            print(json.dumps(result) if args.json else
                  f"altered {args.name}: " + ", ".join([f"{k}={v}" for k, v in changes.items()]
                                                       + [f"{k} deleted" for k in args.delete]))
        elif args.action == "add-partitions":
            await admin.create_partitions(args.name, args.total)
            print(json.dumps({"topic": args.name, "partitions": args.total}) if args.json
                  else f"{args.name} now has {args.total} partitions")
        else:
            await _describe_topics(admin, args, EARLIEST, LATEST)
    return 0


async def _describe_topics(admin, args, earliest_ts: int, latest_ts: int) -> None:
    descriptions = await admin.describe_topics(args.names or None)
    tps = [(d.name, p.partition) for d in descriptions for p in d.partitions if p.leader >= 0]
    earliest = await admin.list_offsets({tp: earliest_ts for tp in tps}) if tps else {}
    latest = await admin.list_offsets({tp: latest_ts for tp in tps}) if tps else {}
    document = []
    for description in descriptions:
        configs = await admin.describe_configs(description.name)
        partitions = [{
            "partition": p.partition, "leader": p.leader, "leader_epoch": p.leader_epoch,
            "replicas": list(p.replicas), "isr": list(p.isr), "error": p.error_code,
            "log_start_offset": earliest.get((description.name, p.partition)),
            "log_end_offset": latest.get((description.name, p.partition)),
        } for p in description.partitions]
        # The policy is shown whatever its source: a compacted topic reads differently (gaps, latest per key).
        policy = next((c.value for c in configs if c.name == "cleanup.policy"), None)
        document.append({
            "topic": description.name, "internal": description.internal, "cleanup_policy": policy,
            "partitions": partitions,
            "replication_factor": max((len(p.replicas) for p in description.partitions), default=0),
            "configs": [{"name": c.name, "value": None if c.sensitive else c.value, "source": c.source,
                         "read_only": c.read_only} for c in configs],
        })
    if args.json:
        print(json.dumps(document))
        return
    for number, topic in enumerate(document):
        if number:
            print()
        print(f"topic {topic['topic']}  partitions {len(topic['partitions'])}  "
              f"replication factor {topic['replication_factor']}  cleanup.policy {_show(topic['cleanup_policy'])}"
              + ("  (internal)" if topic["internal"] else ""))
        shown = [c for c in topic["configs"] if args.all_configs or c["source"] == "DYNAMIC_TOPIC_CONFIG"]
        if shown:
            print("configs: " + ", ".join(f"{c['name']}={_show(c['value'])}" for c in shown))
        rows = [["PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "LOG-START", "LOG-END"]]
        for p in topic["partitions"]:
            rows.append([str(p["partition"]), str(p["leader"]), _show(p["leader_epoch"]),
                         ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])),
                         _show(p["log_start_offset"]), _show(p["log_end_offset"])])
        print(_table(rows))


def _report(args, verb: str, results: dict) -> None:
    from copyless.client.errors import error_name

    if args.json:
        print(json.dumps({name: (error_name(code) if code else None) for name, code in results.items()}))
    else:
        for name, code in results.items():
            print(f"{verb} {name}" if code == 0 else f"{name}: {error_name(code)}")


# --- transactions -------------------------------------------------------------------------------------------


def _run_transactions(args) -> int:
    return run(args, _transactions(args))


async def _transactions(args) -> int:
    from copyless.client.admin import Admin

    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        if args.transactions_command == "list":
            listed = await admin.list_transactions()
            if args.json:
                print(json.dumps([{"transactional_id": t.transactional_id, "producer_id": t.producer_id,
                                   "state": t.state, "coordinator": t.coordinator} for t in listed]))
            else:
                print(_table([["TRANSACTIONAL-ID", "PRODUCER-ID", "STATE", "COORDINATOR"]] +
                             [[t.transactional_id, str(t.producer_id), t.state, str(t.coordinator)] for t in listed]))
        else:
            t = await admin.describe_transaction(args.transactional_id)
            partitions = [f"{tp.topic}-{tp.partition}" for tp in t.partitions]
            if args.json:
                print(json.dumps({"transactional_id": t.transactional_id, "coordinator": t.coordinator,
                                  "state": t.state, "producer_id": t.producer_id, "producer_epoch": t.producer_epoch,
                                  "timeout_ms": t.timeout_ms, "start_ms": t.start_ms, "partitions": partitions}))
            else:
                print(f"transactional id {t.transactional_id}: state {t.state}, producer {t.producer_id} epoch "
                      f"{t.producer_epoch}, timeout {t.timeout_ms} ms, coordinator node {t.coordinator}")
                if partitions:
                    print("partitions: " + ", ".join(partitions))
    return 0


# --- groups -------------------------------------------------------------------------------------------------


def _run_groups(args) -> int:
    return run(args, _groups(args))


async def _groups(args) -> int:
    from copyless.client.admin import Admin

    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        command = args.groups_command
        if command == "list":
            groups = await admin.list_groups()
            if args.json:
                print(json.dumps([{"group": g, "protocol_type": t} for g, t in groups]))
            else:
                print(_table([["GROUP", "PROTOCOL-TYPE"]] + [[g, t or "-"] for g, t in groups]))
        elif command == "describe":
            info = await admin.describe_group(args.group)
            if info.state == "Dead" and not info.members and not info.offsets:
                # Kafka describes a group it has never heard of as Dead, with nothing in it.
                from copyless.client.errors import KafkaError

                raise KafkaError(GROUP_ID_NOT_FOUND, f"group {args.group!r} does not exist")
            _print_group(args, info)
        elif command == "delete":
            results = await admin.delete_groups(args.groups)
            _report(args, "deleted group", results)
        else:
            await _reset_offsets(admin, args)
    return 0


def _print_group(args, info) -> None:
    members = [{"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                "host": m.host, "assignment": [f"{tp.topic}-{tp.partition}" for tp in m.assignment]}
               for m in info.members]
    rows = [{"topic": o.topic, "partition": o.partition, "committed_offset": o.committed_offset,
             "log_end_offset": o.log_end_offset, "lag": o.lag, "member_id": o.member_id, "host": o.host,
             "client_id": o.client_id} for o in info.offsets]
    if args.json:
        print(json.dumps({"group": info.group, "state": info.state, "protocol_type": info.protocol_type,
                          "protocol": info.protocol, "members": members, "partitions": rows}))
        return
    print(f"group {info.group}: state {info.state}, protocol {info.protocol or '-'} "
          f"({info.protocol_type or 'no group management'}), {plural(len(members), 'member')}")
    table = [["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"]]
    for r in rows:
        table.append([r["topic"], str(r["partition"]), _show(r["committed_offset"]), _show(r["log_end_offset"]),
                      _show(r["lag"]), _show(r["member_id"]), _show(r["host"]), _show(r["client_id"])])
    if len(table) > 1:
        print()
        print(_table(table))
    if members:
        print()
        table = [["MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT"]]
        for m in members:
            table.append([m["member_id"], _show(m["group_instance_id"]), m["client_id"], m["host"],
                          ",".join(m["assignment"]) or "-"])
        print(_table(table))


async def _reset_offsets(admin, args) -> None:
    from copyless.client.admin import EARLIEST, LATEST
    from copyless.client.errors import KafkaError

    info = await admin.describe_group(args.group)
    committed = {(o.topic, o.partition): o.committed_offset for o in info.offsets}
    if args.topic:
        tps = []
        for item in args.topic:
            topic, _, listed = item.partition(":")
            described = (await admin.describe_topics([topic]))[0]
            have = [p.partition for p in described.partitions]
            wanted = [int(p) for p in listed.split(",")] if listed else have
            for partition in wanted:
                if partition not in have:
                    raise KafkaError(3, f"topic {topic!r} has no partition {partition}")
                tps.append((topic, partition))
    else:
        tps = sorted(tp for tp, offset in committed.items() if offset is not None)
        if not tps:
            raise ValueError(f"group {args.group!r} has no committed offsets: name the partitions with --topic")
    starts = await admin.list_offsets({tp: EARLIEST for tp in tps})
    ends = await admin.list_offsets({tp: LATEST for tp in tps})
    if args.to_datetime is not None:
        at = await admin.list_offsets({tp: parse_time_ms(args.to_datetime, "--to-datetime") for tp in tps})
    plan = {}
    for tp in tps:
        start, end = starts[tp], ends[tp]
        current = committed.get(tp)
        if args.to_earliest:
            new = start
        elif args.to_latest:
            new = end
        elif args.to_offset is not None:
            new = args.to_offset
        elif args.to_datetime is not None:
            new = at[tp] if at[tp] >= 0 else end
        else:
            new = (current if current is not None else end) + args.shift_by
        plan[tp] = min(max(new, start), end)  # kafka-consumer-groups clamps to the log, too
    if args.execute:
        if info.members:
            raise ValueError(f"group {args.group!r} has {plural(len(info.members), 'running member')} (state "
                             f"{info.state}): stop them first")
        await admin.alter_group_offsets(args.group, plan)
    if args.json:
        print(json.dumps({"group": args.group, "executed": args.execute, "partitions": [
            {"topic": t, "partition": p, "current_offset": committed.get((t, p)), "new_offset": new}
            for (t, p), new in plan.items()]}))
        return
    rows = [["TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"]]
    rows += [[t, str(p), _show(committed.get((t, p))), str(new)] for (t, p), new in plan.items()]
    print(_table(rows))
    if not args.execute:
        print("\n(dry run: nothing committed; add --execute to commit these offsets)")


# --- cluster ------------------------------------------------------------------------------------------------


def _run_cluster(args) -> int:
    return run(args, _cluster(args))


async def _cluster(args) -> int:
    from copyless.client.admin import Admin

    async with Admin(args.bootstrap, client_id="copyless-cli", security=client_security(args)) as admin:
        info = await admin.describe_cluster()
    brokers = [{"node_id": node, "host": host, "port": port, "rack": rack} for node, host, port, rack in info.brokers]
    if args.json:
        print(json.dumps({"cluster_id": info.cluster_id, "controller_id": info.controller_id, "brokers": brokers}))
        return 0
    print(f"cluster {info.cluster_id or '-'}  controller {info.controller_id}  brokers {len(brokers)}")
    rows = [["NODE", "HOST", "PORT", "RACK", ""]]
    for b in brokers:
        rows.append([str(b["node_id"]), b["host"], str(b["port"]), _show(b["rack"]),
                     "controller" if b["node_id"] == info.controller_id else ""])
    print(_table(rows))
    return 0
