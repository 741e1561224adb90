"""The ``copyless`` console script as a user runs it, as a subprocess against a real broker: the README's
quick start as written, stdin lines sent as they arrive, Ctrl-C on a pipe (exit 130), errors by name that
come at once, bad arguments refused, kcat-like formats and JSON records, offsets and times to start from
(and where the log starts and ends when they miss it), group offset resets, and the admin commands."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.polling import wait_until
from tests.support.subprocesses import as_from_a_terminal
from tests.support.topics import unique_topic

COPYLESS = str(Path(sys.executable).parent / "copyless")


def copyless(*args: str, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([COPYLESS, *args], input=input, capture_output=True, timeout=timeout)


def ok(*args: str, **kwargs) -> str:
    done = copyless(*args, **kwargs)
    assert done.returncode == 0, f"{args}: {done.stderr.decode()}"
    return done.stdout.decode()


def test_the_readmes_cli_quick_start_works_as_written(broker):
    b = ("--bootstrap", broker.bootstrap)
    topic, group = unique_topic("orders"), unique_topic("billing")
    ok("topics", "create", topic, "--partitions", "6", *b)
    ok("produce", topic, "-K", ":", *b, input=b"alice:10.00\nbob:25.50\n")
    printed = ok("consume", topic, "--from-beginning", "-e", "-K", ":", *b)
    assert sorted(printed.splitlines()) == ["alice:10.00", "bob:25.50"]
    produced = json.loads(ok("produce", topic, "--count", "20000", "--size", "100", "--acks", "1", "--json", *b))
    assert produced["records"] == 20000 and produced["bytes"] == 2_000_000
    consumed = json.loads(ok("consume", topic, "--group", group, "--from-beginning", "-e", "-q", "--json", *b))
    assert consumed["records"] == 20002
    described = ok("groups", "describe", group, *b)
    assert f"group {group}: state Empty" in described and "LAG" in described
    lags = json.loads(ok("groups", "describe", group, "--json", *b))["partitions"]
    assert len(lags) == 6 and all(row["lag"] == 0 for row in lags)
    topics = json.loads(ok("topics", "describe", topic, "--json", *b))
    assert [p["partition"] for p in topics[0]["partitions"]] == list(range(6))
    assert sum(p["log_end_offset"] for p in topics[0]["partitions"]) == 20002
    assert "PARTITION  LEADER  EPOCH  REPLICAS  ISR  LOG-START  LOG-END" in ok("topics", "describe", topic, *b)


def test_version_and_help_on_every_option():
    import argparse

    from copyless.broker.cli import build_parser

    assert ok("--version").startswith("copyless ")
    assert ok("-V") == ok("--version")
    bare = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif action.option_strings and not action.help:
                bare.append(f"{path} {action.option_strings[0]}")
        # serve, inspect and configs work on a data dir or the registry, not through a broker.
        if path.split()[1:2] and path.split()[1] not in ("serve", "inspect", "configs"):
            options = {o for a in parser._actions for o in a.option_strings}
            if len(path.split()) > 1 and parser._subparsers is None:
                assert {"-b", "--bootstrap"} <= options, f"{path} has no -b/--bootstrap"

    walk(build_parser(), "copyless")
    assert not bare, f"options without help text: {bare}"


def test_stdin_lines_are_sent_as_they_arrive_and_ctrl_c_on_a_pipe_stops_at_once(broker):
    topic = unique_topic("lines")
    ok("topics", "create", topic, *("-b", broker.bootstrap))
    producer = subprocess.Popen([COPYLESS, "produce", topic, "-b", broker.bootstrap, "-H", "origin=pipe"],
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
    try:
        producer.stdin.write(b"first\n")
        producer.stdin.flush()

        def arrived():
            done = copyless("consume", topic, "-o", "beginning", "-e", "--json", "-b", broker.bootstrap)
            return [json.loads(line) for line in done.stdout.splitlines()] or None

        records = wait_until(arrived, what="the first line consumed while stdin is still open", timeout_s=20)
        assert [(r["value"], r["headers"]) for r in records] == [("first", [["origin", "pipe"]])]
        producer.stdin.write(b"second\n")
        producer.stdin.flush()
        wait_until(lambda: len(arrived() or []) == 2, what="the second line", timeout_s=20)
        started = time.monotonic()
        producer.send_signal(signal.SIGINT)
        code = producer.wait(timeout=10)
        assert time.monotonic() - started < 2.5, "Ctrl-C did not stop produce within a second (plus start-up slack)"
        assert code == 130, "Ctrl-C exits 128 + SIGINT, after sending what was read"
        assert b"produced 2 records" in producer.stderr.read()
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()


def test_missing_and_invalid_topics_and_partitions_fail_at_once_by_name(broker):
    b = ("-b", broker.bootstrap)
    topic = unique_topic("four")
    ok("topics", "create", topic, "--partitions", "4", *b)
    cases = [
        (("consume", topic, "-p", "9", *b), "UNKNOWN_TOPIC_OR_PARTITION", "has no partition 9"),
        (("consume", unique_topic("missing"), *b), "UNKNOWN_TOPIC_OR_PARTITION", ""),
        (("produce", "a/b", *b), "INVALID_TOPIC_EXCEPTION", ""),
        (("produce", topic, "-p", "7", *b), "UNKNOWN_TOPIC_OR_PARTITION", "has no partition 7"),
    ]
    for args, name, detail in cases:
        started = time.monotonic()
        done = copyless(*args, input=b"x\n", timeout=30)
        took = time.monotonic() - started
        assert done.returncode == 1, (args, done.stderr)
        stderr = done.stderr.decode()
        assert f"error: {name}" in stderr and detail in stderr, (args, stderr)
        assert took < 10, f"{args} took {took:.1f} s to fail"
    as_json = copyless("consume", topic, "-p", "9", "--json", *b)
    assert json.loads(as_json.stdout)["error"] == "UNKNOWN_TOPIC_OR_PARTITION"
    down = copyless("topics", "list", "-b", "127.0.0.1:1")
    assert down.returncode == 1 and "copyless topics list: error:" in down.stderr.decode()


def test_consume_formats_offsets_and_times(broker):
    b = ("-b", broker.bootstrap)
    topic = unique_topic("fmt")
    ok("topics", "create", topic, *b)
    ok("produce", topic, "-K", "=", *b, input=b"k0=v0\nk1=v1\nk2=v2\n")
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    ok("produce", topic, "-K", "=", "-H", "h=1", *b, input=b"k3=v3\n")
    formatted = ok("consume", topic, "-o", "beginning", "-e", "-f", r"%t|%p|%o|%k|%s|%h|%K|%S\n", *b)
    assert formatted.splitlines()[0] == f"{topic}|0|0|k0|v0||2|2"
    assert formatted.splitlines()[3] == f"{topic}|0|3|k3|v3|h=1|2|2"
    assert ok("consume", topic, "-o", "2", "-e", *b).splitlines() == ["v2", "v3"]
    assert ok("consume", topic, "-o", "-1", "-e", *b).splitlines() == ["v3"]
    assert ok("consume", topic, "--from-time", str(middle), "-e", *b).splitlines() == ["v3"]
    records = [json.loads(line) for line in ok("consume", topic, "-o", "beginning", "-e", "--json", *b).splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in records] == [(i, f"k{i}", f"v{i}") for i in range(4)]
    assert set(records[0]) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
    assert records[3]["headers"] == [["h", "1"]] and records[3]["timestamp"] >= middle


def test_groups_reset_offsets_is_a_dry_run_until_execute(broker):
    b = ("-b", broker.bootstrap)
    topic, group = unique_topic("reset"), unique_topic("g")
    ok("topics", "create", topic, "--partitions", "2", *b)
    ok("produce", topic, "-p", "0", *b, input=b"".join(b"%d\n" % i for i in range(10)))
    ok("consume", topic, "--group", group, "--from-beginning", "-e", "-q", *b)
    assert {g["group"] for g in json.loads(ok("groups", "list", "--json", *b))} >= {group}

    def committed():
        return {(r["topic"], r["partition"]): r["committed_offset"]
                for r in json.loads(ok("groups", "describe", group, "--json", *b))["partitions"]}

    assert committed()[(topic, 0)] == 10
    plan = json.loads(ok("groups", "reset-offsets", group, "--topic", f"{topic}:0", "--shift-by", "-4", "--json", *b))
    assert plan["executed"] is False and plan["partitions"][0]["new_offset"] == 6
    assert committed()[(topic, 0)] == 10, "a dry run committed"
    ok("groups", "reset-offsets", group, "--topic", f"{topic}:0", "--shift-by", "-4", "--execute", *b)
    assert committed()[(topic, 0)] == 6
    ok("groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute", *b)
    assert committed()[(topic, 0)] == 0 and committed()[(topic, 1)] == 0
    ok("groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset", "99", "--execute", *b)
    assert committed()[(topic, 0)] == 10, "not clamped to the log end"
    assert ok("consume", topic, "--group", group, "-e", *b).splitlines() == []


def test_cluster_info(broker):
    info = json.loads(ok("cluster", "info", "--json", "-b", broker.bootstrap))
    assert info["controller_id"] >= 0 and len(info["brokers"]) == 1
    assert info["brokers"][0]["port"] == broker.port


def test_alter_config_add_partitions_and_delete_group(broker):
    b = ("-b", broker.bootstrap)
    topic, group = unique_topic("admin"), unique_topic("g")
    ok("topics", "create", topic, "--partitions", "2", *b)
    ok("topics", "alter-config", topic, "--set", "retention.ms=3600000", *b)
    configs = {c["name"]: c for c in json.loads(ok("topics", "describe", topic, "--json", *b))[0]["configs"]}
    assert configs["retention.ms"]["value"] == "3600000" and configs["retention.ms"]["source"] == "DYNAMIC_TOPIC_CONFIG"
    ok("topics", "alter-config", topic, "--delete", "retention.ms", *b)
    assert f"topic {topic}  partitions 2  replication factor 1  cleanup.policy delete" in ok("topics", "describe",
                                                                                          topic, *b)
    ok("topics", "alter-config", topic, "--set", "cleanup.policy=compact,delete", *b)
    assert json.loads(ok("topics", "describe", topic, "--json", *b))[0]["cleanup_policy"] == "compact,delete"
    assert "cleanup.policy compact,delete" in ok("topics", "describe", topic, *b)
    ok("topics", "alter-config", topic, "--delete", "cleanup.policy", *b)
    ok("topics", "add-partitions", topic, "--total", "5", *b)
    assert len(json.loads(ok("topics", "describe", topic, "--json", *b))[0]["partitions"]) == 5
    ok("produce", topic, "-p", "4", *b, input=b"late\n")
    ok("consume", topic, "--group", group, "--from-beginning", "-e", "-q", *b)
    ok("groups", "delete", group, *b)
    assert group not in {g["group"] for g in json.loads(ok("groups", "list", "--json", *b))}


def test_consume_ctrl_c_prints_what_was_read_and_exits_within_a_second(broker):
    topic = unique_topic("tail")
    ok("produce", topic, "-b", broker.bootstrap, input=b"one\ntwo\n")
    tail = subprocess.Popen([COPYLESS, "consume", topic, "-o", "beginning", "-b", broker.bootstrap],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
    printed: list[bytes] = []
    reader = threading.Thread(target=lambda: printed.extend(iter(tail.stdout.readline, b"")), daemon=True)
    reader.start()
    try:
        # It has read both and waits for more (a fixed sleep raced the process's start on a loaded machine).
        wait_until(lambda: len(printed) == 2, what="both records printed", timeout_s=30)
        started = time.monotonic()
        tail.send_signal(signal.SIGINT)
        tail.wait(timeout=10)
        reader.join(timeout=10)
        err = tail.stderr.read()
        assert time.monotonic() - started < 2.5
        assert tail.returncode == 130 and printed == [b"one\n", b"two\n"], err
        assert b"consumed 2 records" in err
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()


def test_what_a_new_user_gets_wrong_is_refused_or_explained(broker):
    b = ("-b", broker.bootstrap)
    topic = unique_topic("edges")
    ok("topics", "create", topic, *b)
    for args, option in ((("--count", "-3"), "--count"), (("--count", "2", "--size", "-5"), "--size")):
        done = copyless("produce", topic, *args, *b)
        assert done.returncode == 2 and f"argument {option}: must be 0 or more" in done.stderr.decode(), done.stderr
    assert copyless("consume", topic, "--count", "-1", *b).returncode == 2
    single = copyless("produce", topic, "--count", "1", "--size", "1", *b)
    assert single.returncode == 0 and b"produced 1 record (1 byte) in " in single.stderr, single.stderr
    ok("produce", topic, *b, input=b"two\nthree\n")
    last = copyless("consume", topic, "-o", "2", "-e", *b)
    assert last.returncode == 0 and b"consumed 1 record (5 bytes) in " in last.stderr, last.stderr
    # -o past the end (or before the start) says where the log is instead of waiting or ending silently.
    past = copyless("consume", topic, "-o", "100", "-e", *b)
    assert past.returncode == 1
    assert (f"error: OFFSET_OUT_OF_RANGE: -o 100 is past the end of {topic}-0: its log end offset is 3 "
            f"(offsets 0..2" in past.stderr.decode()), past.stderr
    assert ok("consume", topic, "-o", "3", "-e", *b) == ""  # the log end itself: the next record's offset
    group = unique_topic("nobody")
    missing = copyless("groups", "describe", group, *b)
    assert missing.returncode == 1
    assert f"error: GROUP_ID_NOT_FOUND: group {group!r} does not exist" in missing.stderr.decode(), missing.stderr
    as_json = json.loads(copyless("groups", "describe", group, "--json", *b).stdout)
    assert as_json["error"] == "GROUP_ID_NOT_FOUND"


def test_ctrl_c_while_connecting_exits_130():
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: the client waits in its handshake
    silent.settimeout(30)
    try:
        command = subprocess.Popen([COPYLESS, "topics", "list", "-b", f"127.0.0.1:{silent.getsockname()[1]}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal)
        connection, _peer = silent.accept()  # kept open: a close would end the handshake
        connection.settimeout(30)
        assert connection.recv(4)  # the ApiVersions request's first bytes: the client waits for its answer now
        command.send_signal(signal.SIGINT)
        _out, err = command.communicate(timeout=10)
        assert command.returncode == 130, err
        assert b"Traceback" not in err
        connection.close()
    finally:
        silent.close()
