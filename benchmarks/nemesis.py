"""The soak: minutes of random overlapping faults under the Jepsen-style workload, and the anomalies found.

    python -m benchmarks.nemesis --minutes 10 --seed 7 [--without disk-full ...] [--out DIR]

The run of ``tests.support.jepsen`` (the suite's tests/cluster/test_jepsen.py runs a short schedule of the
same): three brokers and an etcd on hosts of a network lab, etcd behind a delaying proxy, each data dir on a
tmpfs, a topic of 3 partitions (RF 3, min.insync.replicas 2); an idempotent acks=all producer at 90
records/s, a plain consumer and a two-member group; the nemesis draws steps of one to three overlapping
faults from every kind of ``tests.support.nemesis.KINDS`` (less ``--without``) from ``--seed`` for
``--minutes``; then everything is healed and ``tests.support.checker`` reads the history.

Output: a table of faults injected by kind, records sent / acknowledged / failed, and anomalies by kind
(every kind, 0 included), printed and written to ``DIR/nemesis.json`` (DIR: ``benchmarks/results`` unless
``--out``), with the first anomalies, the notes and the nemesis' timeline in the JSON. Needs root (network
namespaces, tmpfs mounts, a mount namespace for a power loss's new boot id). The work dir (the brokers'
logs) is kept, and named, when the run found an anomaly or did not recover. ``--quick`` runs 2 minutes,
tiny runs (the suite) one step. Exit status 1 when an anomaly was found.
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import Benchmark
from tests.support.checker import KINDS as ANOMALY_KINDS
from tests.support.jepsen import run
from tests.support.nemesis import KINDS, schedule, stage
from tests.support.topics import unique_topic

RESULTS = Path(__file__).resolve().parent / "results"


def arguments(parser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the nemesis runs (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: random, printed)")
    parser.add_argument("--without", action="append", default=[], choices=KINDS, metavar="KIND",
                        help=f"leave a fault kind out (repeatable): {', '.join(KINDS)}")


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--out" not in argv and not any(a.startswith("--out=") for a in argv):
        argv += ["--out", str(RESULTS)]
    bench = Benchmark("nemesis", "minutes of overlapping faults under an acks=all workload, and the anomalies found",
                      argv, arguments=arguments)
    args = bench.args
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    kinds = tuple(k for k in KINDS if k not in set(args.without))
    if not kinds:
        raise SystemExit("every fault kind is left out")
    minutes = bench.pick(full=args.minutes, quick=min(args.minutes, 2.0), tiny=0.2)
    max_steps = 1 if bench.mode == "tiny" else None
    bench.log(f"nemesis seed {seed}, {minutes:g} min of {', '.join(kinds)}")
    workdir = Path(tempfile.mkdtemp(prefix="copyless-nemesis-"))
    with stage(workdir, unique_topic("soak"), 3, seed=seed) as st:
        def progress(nemesis) -> None:
            bench.log(f"  {sum(nemesis.injected.values())} faults injected: {nemesis.injected}")
        result = run(st, schedule(seed, kinds, 3), minutes * 60, seed=seed, workdir=workdir,
                     max_steps=max_steps, progress=progress)
    if result.anomalies or result.notes:
        bench.note(f"the brokers' logs are kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    for kind in KINDS:
        bench.row(table="faults", kind=kind, count=result.injected.get(kind, 0) if kind in kinds else None)
    stream = result.stream
    for what, count in (("records sent", len(stream.sends)), ("records acknowledged", len(stream.acks)),
                        ("records failed (not acknowledged)", len(stream.failed)),
                        ("producer fatal errors", len(stream.fatal)),
                        ("records polled", len(result.history.polls))):
        bench.row(table="records", kind=what, count=count)
    for kind, count in result.anomaly_counts.items():
        bench.row(table="anomalies", kind=kind, count=count)
    for note in result.notes:
        bench.note(note)
    print(result.report(limit=30) if result.anomalies or result.notes else
          f"seed {seed}: no anomaly; {len(stream.acks)} records acknowledged")
    document = bench.finish(
        extra={"seed": seed, "minutes": minutes, "kinds": list(kinds), "without": list(args.without),
               "run_s": round(result.seconds, 1),
               "faults": result.injected, "anomaly_counts": result.anomaly_counts,
               "anomalies": [str(a) for a in result.anomalies[:200]], "timeline": result.timeline},
        chart=lambda fig: chart(fig, result, kinds), columns=["table", "kind", "count"])
    if result.anomalies:
        raise SystemExit(1)
    return document


def chart(fig, result, kinds) -> None:
    left, right = fig.subplots(1, 2)
    left.barh(list(kinds), [result.injected.get(k, 0) for k in kinds], color="tab:blue")
    left.set_title("faults injected")
    left.invert_yaxis()
    counts = result.anomaly_counts
    right.barh(list(ANOMALY_KINDS), [counts[k] for k in ANOMALY_KINDS], color="tab:red")
    right.set_title(f"anomalies ({len(result.stream.acks)} records acknowledged)")
    right.invert_yaxis()
    fig.set_size_inches(11, 4.5)
    fig.tight_layout()


if __name__ == "__main__":
    main()
