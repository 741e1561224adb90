"""Cluster metadata in etcd: controller failover, CreateTopics latency, etcd operations on the produce path.

What runs (copyless only: these are figures about its own metadata layer; three brokers on one etcd, the
products' defaults, so broker.session.timeout.ms is 2 s, etcd's shortest lease):

- ``controller``: the controller SIGKILLed ``--kills`` times (5; 2 with --quick). From the kill, the project's
  admin client tries a CreateTopics (a fresh 1-partition RF-1 topic, 3 s request timeout, a new client on
  the live brokers each try, 50 ms apart) until one succeeds; Metadata is polled meanwhile for the new
  controller's id. Per kill: seconds to a new controller in Metadata and to the first successful
  CreateTopics, then the killed broker is started again and must register before the next kill.
- ``create``: CreateTopics latency as a client sees it (request sent -> response, one admin connection
  kept, topics created one at a time, 1 partition each), on the embedded single node (metadata in
  ``topics.json``) and on the etcd-backed cluster at replication factor 1 and 3, in ``--rounds`` rounds of
  ``TOPICS_PER_ROUND`` topics, the sides alternating. Both run ``log.segment.bytes`` 16 MiB: a topic's
  first segment is allocated whole, and 1 GiB of fallocate would be measured instead of the metadata.
- ``etcd``: etcd operations per produce request on the hot path (target: zero). A confluent-kafka producer
  (linger.ms 0, so many small requests) writes to an RF-3 topic with acks=1 and with acks=all; every
  broker's ``stats-json`` (``cluster.etcd_calls`` by kind, ``requests`` by API key) is read before and
  after. Lease keepalives are a clock (a third of the session timeout), not a function of the produce
  requests, so they are counted apart; everything else is charged to the window's produce requests.

Rows: ``section, side, round, kill`` and per section: controller ``killed, new_controller,
new_controller_s, create_ok_s, create_attempts, rejoin_s``; create ``replication_factor, topics, p50_ms,
p99_ms, mean_ms, max_ms``; etcd ``acks, records, produce_requests, fetch_requests, etcd_calls,
etcd_calls_by_kind, keepalives, window_s, etcd_calls_per_produce_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from typing import Any

from benchmarks._harness import Benchmark, percentile
from benchmarks._replication.clusters import Cluster, CopylessCluster, EtcdServer, PortPool, SingleCopyless
from benchmarks._replication.timeline import summary
from benchmarks._throughput.report import ratio_verdict

SECTIONS = ("controller", "create", "etcd")
TOPICS_PER_ROUND = 20
SMALL_SEGMENTS = {"log.segment.bytes": 16 << 20}
CREATE_RETRY_S = 0.05
CONTROLLER_TIMEOUT_S = 60.0
# Calls that are a clock, not work: the lease keepalive every third of broker.session.timeout.ms.
CLOCK_CALLS = ("LeaseKeepAlive",)


# ----------------------------------------------------------------------------------------------------------
# controller failover


async def _create_once(bootstrap: str, name: str, replication_factor: int = 1, timeout_ms: int = 3000) -> None:
    from copyless.client.admin import Admin

    async with Admin(bootstrap, request_timeout_ms=timeout_ms) as admin:
        await admin.create_topics([name], num_partitions=1, replication_factor=replication_factor)


def _await_new_controller(cluster: Cluster, old: int, since: float) -> tuple[int | None, float | None]:
    deadline = since + CONTROLLER_TIMEOUT_S
    while time.monotonic() < deadline:
        controller = cluster.controller(timeout_s=1.0)
        if controller > 0 and controller != old:
            return controller, time.monotonic() - since
        time.sleep(CREATE_RETRY_S)
    return None, None


async def _controller_kill(cluster: Cluster, number: int) -> dict[str, Any]:
    old = await asyncio.to_thread(cluster.controller)
    if old <= 0:
        raise RuntimeError("no controller in Metadata")
    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.nodes[old].kill)
    watcher = asyncio.create_task(asyncio.to_thread(_await_new_controller, cluster, old, killed_at))
    attempts = 0
    create_ok_s = None
    while time.monotonic() - killed_at < CONTROLLER_TIMEOUT_S:
        attempts += 1
        try:
            await _create_once(cluster.bootstrap, f"bench-ctl-{uuid.uuid4().hex[:8]}")
        except Exception:  # refused, NOT_CONTROLLER, timed out: the cluster has not taken over yet
            await asyncio.sleep(CREATE_RETRY_S)
            continue
        create_ok_s = time.monotonic() - killed_at
        break
    new_controller, new_controller_s = await watcher
    restart_at = time.monotonic()
    await asyncio.to_thread(cluster.nodes[old].start)
    await asyncio.to_thread(_await_registered, cluster)
    return {"kill": number, "killed": old, "new_controller": new_controller, "new_controller_s": new_controller_s,
            "create_ok_s": create_ok_s, "create_attempts": attempts, "rejoin_s": time.monotonic() - restart_at}


def _await_registered(cluster: Cluster) -> None:
    deadline = time.monotonic() + CONTROLLER_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if len(cluster.metadata(None).brokers) == len(cluster.nodes):
                return
        time.sleep(0.1)
    raise TimeoutError("the restarted broker did not register")


def controller_section(bench: Benchmark, cluster: Cluster, kills: int) -> None:
    for number in range(1, kills + 1):
        row = asyncio.run(_controller_kill(cluster, number))
        bench.row(section="controller", side="copyless", round=None, **row)
        bench.log(f"controller kill {number}/{kills}: node {row['killed']}; new controller after "
                  f"{_fmt_s(row['new_controller_s'])}, CreateTopics again after {_fmt_s(row['create_ok_s'])}")


def _fmt_s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


# ----------------------------------------------------------------------------------------------------------
# CreateTopics latency


async def _create_latencies(bootstrap: str, count: int, replication_factor: int) -> tuple[list[float], list[str]]:
    from copyless.client.admin import Admin

    names = [f"bench-create-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    latencies = []
    async with Admin(bootstrap) as admin:
        await admin.list_topics()  # connected and metadata loaded before the first timed request
        for name in names:
            started = time.perf_counter()
            await admin.create_topics([name], num_partitions=1, replication_factor=replication_factor)
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies, names


async def _delete(bootstrap: str, names: list[str]) -> None:
    from copyless.client.admin import Admin

    async with Admin(bootstrap) as admin:
        for name in names:
            with contextlib.suppress(Exception):
                await admin.delete_topics([name], if_exists=True)


def create_section(bench: Benchmark, sides: list[tuple[str, Cluster, int]], rounds: int, per_round: int) -> None:
    for number in range(1, rounds + 1):
        for side, cluster, replication_factor in (sides if number % 2 else sides[::-1]):
            latencies, names = asyncio.run(_create_latencies(cluster.bootstrap, per_round, replication_factor))
            bench.row(section="create", side=side, round=number, replication_factor=replication_factor,
                      topics=len(latencies), p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99),
                      mean_ms=statistics.mean(latencies), max_ms=max(latencies))
            bench.log(f"create round {number}: {side}: p50 {percentile(latencies, 50):.1f} ms")
            asyncio.run(_delete(cluster.bootstrap, names))


# ----------------------------------------------------------------------------------------------------------
# etcd calls per produce request


def _counters(cluster: CopylessCluster) -> dict[str, Any]:
    """Summed over the brokers: etcd calls by kind, Produce (API key 0) and Fetch (1) requests."""
    calls: dict[str, int] = {}
    produce = fetch = 0
    for node_id in cluster.nodes:
        stats = cluster.stats(node_id)
        for kind, count in stats["cluster"]["etcd_calls"].items():
            calls[kind] = calls.get(kind, 0) + count
        produce += stats["requests"].get("0", 0)
        fetch += stats["requests"].get("1", 0)
    return {"calls": calls, "produce": produce, "fetch": fetch, "at": time.monotonic()}


def etcd_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two ``_counters`` readings: etcd calls by kind (those that changed), the clock
    calls apart, and the rest per produce request."""
    by_kind = {k: after["calls"].get(k, 0) - before["calls"].get(k, 0)
               for k in sorted(set(before["calls"]) | set(after["calls"]))}
    by_kind = {k: v for k, v in by_kind.items() if v}
    clock = sum(v for k, v in by_kind.items() if k in CLOCK_CALLS)
    work = sum(v for k, v in by_kind.items() if k not in CLOCK_CALLS)
    produce = after["produce"] - before["produce"]
    return {"produce_requests": produce, "fetch_requests": after["fetch"] - before["fetch"], "etcd_calls": work,
            "etcd_calls_by_kind": by_kind, "keepalives": clock, "window_s": after["at"] - before["at"],
            "etcd_calls_per_produce_request": work / produce if produce else None}


def etcd_section(bench: Benchmark, cluster: CopylessCluster, records: int) -> None:
    from confluent_kafka import Producer

    topic = f"bench-etcd-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})
    value = b"x" * 100
    for acks in ("1", "all"):
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": acks, "linger.ms": 0,
                             "enable.idempotence": False, "log_level": 0})
        producer.list_topics(topic, timeout=30)  # connected before the window opens
        before = _counters(cluster)
        failed = []
        for i in range(records):
            while True:
                try:
                    producer.produce(topic, value,
                                     on_delivery=lambda err, _m, failed=failed: err and failed.append(err))
                    break
                except BufferError:
                    producer.poll(0.01)
            if i % 100 == 0:
                producer.poll(0)
        if producer.flush(120) or failed:
            raise RuntimeError(f"etcd section, acks={acks}: {len(failed)} records failed: {failed[:1]}")
        delta = etcd_delta(before, _counters(cluster))
        bench.row(section="etcd", side="copyless", round=None, acks=acks, records=records, **delta)
        bench.log(f"etcd, acks={acks}: {delta['produce_requests']} produce requests, {delta['etcd_calls']} etcd "
                  f"calls besides {delta['keepalives']} keepalives")
    with contextlib.suppress(Exception):
        cluster.delete_topic(topic)


# ----------------------------------------------------------------------------------------------------------
# Tables and chart


def _rows(bench: Benchmark, **match) -> list[dict[str, Any]]:
    return [r for r in bench.rows if all(r.get(k) == v for k, v in match.items())]


def tables(bench: Benchmark) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    kills = _rows(bench, section="controller")
    if kills:
        lines = []
        for key, what in (("new_controller_s", "new controller in Metadata"),
                          ("create_ok_s", "first successful CreateTopics")):
            figures = summary([r[key] for r in kills])
            lines.append({"from the kill to": what, "kills": len(kills), "min_s": figures["min"],
                          "median_s": figures["median"], "max_s": figures["max"], "never": figures["missing"]})
            ratios[f"controller_{key.removesuffix('_s')}_median_s"] = figures["median"]
            ratios[f"controller_{key.removesuffix('_s')}_max_s"] = figures["max"]
        bench.table("Controller failover after SIGKILL of the controller (3 brokers)", lines)
    sides = list(dict.fromkeys(r["side"] for r in _rows(bench, section="create")))
    if sides:
        lines = []
        embedded = {r["round"]: r["p50_ms"] for r in _rows(bench, section="create", side=sides[0])}
        for side in sides:
            runs = _rows(bench, section="create", side=side)
            per_round = [r["p50_ms"] / embedded[r["round"]] for r in runs if embedded.get(r["round"])]
            line = {"side": side, "rounds": len(runs), "topics": sum(r["topics"] for r in runs),
                    "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                    "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                    "mean_ms": statistics.median(r["mean_ms"] for r in runs)}
            if side != sides[0]:
                line.update({f"vs {sides[0]}": round(statistics.median(per_round), 3) if per_round else None,
                             **ratio_verdict(per_round)})
                ratios[f"create_p50_ms_{side.split()[0]}_rf{runs[0]['replication_factor']}"] = line["p50_ms"]
            else:
                ratios["create_p50_ms_embedded"] = line["p50_ms"]
            lines.append(line)
        bench.table("CreateTopics latency, 1 partition, one at a time (medians over rounds of the p50, p99, "
                    "mean)", lines)
    for row in _rows(bench, section="etcd"):
        ratios[f"etcd_calls_per_produce_request_acks_{row['acks']}"] = row["etcd_calls_per_produce_request"]
    return ratios


def chart(bench: Benchmark):
    def draw(fig) -> None:
        axes = fig.subplots(1, 3)
        kills = _rows(bench, section="controller")
        ax = axes[0]
        for i, key in enumerate(("new_controller_s", "create_ok_s")):
            ax.scatter([i] * len(kills), [r[key] or 0 for r in kills])
        ax.set_xticks([0, 1], ["new controller", "CreateTopics ok"])
        ax.set_ylabel("s after SIGKILL")
        ax.set_title("controller failover", fontsize=9)
        ax = axes[1]
        sides = list(dict.fromkeys(r["side"] for r in _rows(bench, section="create")))
        ax.bar(range(len(sides)), [statistics.median(r["p50_ms"] for r in _rows(bench, section="create", side=s))
                                   for s in sides])
        ax.set_xticks(range(len(sides)), [s.replace(" ", "\n") for s in sides], fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title("CreateTopics p50", fontsize=9)
        ax = axes[2]
        runs = _rows(bench, section="etcd")
        ax.bar([f"acks={r['acks']}" for r in runs], [r["etcd_calls_per_produce_request"] or 0 for r in runs])
        ax.set_title("etcd calls per produce request", fontsize=9)
    return draw


def main(argv=None) -> dict[str, Any]:
    def arguments(parser) -> None:
        parser.add_argument("--sections", default=",".join(SECTIONS), help="subset of " + ",".join(SECTIONS))
        parser.add_argument("--kills", type=int, default=None, help="controller kills (default 5; 2 with --quick)")
        parser.add_argument("--rounds", type=int, default=None, help="rounds of the create section (default 5)")

    bench = Benchmark("cluster_metadata", "cluster metadata in etcd: controller failover, CreateTopics latency "
                      "vs the embedded single node, etcd calls per produce request", argv, arguments=arguments)
    args = bench.args
    sections = [s for s in args.sections.split(",") if s]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections: {', '.join(sorted(unknown))}")
    kills = args.kills or bench.pick(full=5, quick=2, tiny=1)
    rounds = args.rounds or bench.pick(full=5, quick=2, tiny=2)
    per_round = bench.pick(full=TOPICS_PER_ROUND, quick=10, tiny=3)
    bench.note("three copyless brokers on one etcd (loopback), copyless's defaults (broker.session.timeout.ms 2 s) "
               "but for 16 MiB segments, on the cluster and the single node alike")
    with bench.scratch_dir() as scratch, contextlib.ExitStack() as stack:
        ports = PortPool()
        etcd = stack.enter_context(EtcdServer(scratch / "etcd", ports))
        cluster = stack.enter_context(CopylessCluster(scratch / "cluster", etcd, ports, config=SMALL_SEGMENTS))
        if "controller" in sections:
            controller_section(bench, cluster, kills)
        if "create" in sections:
            single = stack.enter_context(SingleCopyless(scratch / "single", ports, config=SMALL_SEGMENTS))
            create_section(bench, [("embedded single node", single, 1), ("etcd cluster RF 1", cluster, 1),
                                   ("etcd cluster RF 3", cluster, 3)], rounds, per_round)
            single.stop()
        if "etcd" in sections:
            etcd_section(bench, cluster, bench.pick(full=20_000, quick=5_000, tiny=500))
    ratios = tables(bench)
    columns = ["section", "side", "round", "kill", "killed", "new_controller", "new_controller_s", "create_ok_s",
               "create_attempts", "rejoin_s", "replication_factor", "topics", "p50_ms", "p99_ms", "mean_ms",
               "max_ms", "acks", "records", "produce_requests", "fetch_requests", "etcd_calls", "keepalives",
               "window_s", "etcd_calls_per_produce_request", "etcd_calls_by_kind"]
    return bench.finish(ratios=ratios, chart=chart(bench), columns=columns, extra={"sections": sections})


if __name__ == "__main__":
    main()
