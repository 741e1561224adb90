"""Group session timers run on the monotonic clock (``broker.groups.service``, "Clocks"): a step of the wall
clock (an NTP correction, an operator's ``date -s``) must not expire a group's members.

The broker runs in this process (``tests.support.live_broker``), so the test can step the wall clock the
broker reads (``time.time``) by an hour while the monotonic clock goes on as before, which is what a step
of the system clock does to a process. Members are raw protocol clients on real sockets.
"""

from __future__ import annotations

import threading
import time

from kio.schema.errors import ErrorCode

from tests.support.live_broker import LiveBroker
from tests.support.polling import wait_until
from tests.support.raw_group import RawMember

HOUR_S = 3600.0


def test_a_wall_clock_step_does_not_expire_the_members(tmp_path, monkeypatch):
    live = LiveBroker(tmp_path / "data", "uvloop", group_initial_rebalance_delay_ms=0)
    bootstrap = f"127.0.0.1:{live.port}"
    a = b = None
    try:
        a, b = RawMember(bootstrap, "stepped"), RawMember(bootstrap, "stepped")
        def joined_once_loaded():
            answer = a.join(session_ms=6000, rebalance_ms=6000)
            loading = (ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available)
            return None if answer.error_code in loading else answer

        response = wait_until(joined_once_loaded, what="the coordinator to load", timeout_s=30)
        assert response.error_code == ErrorCode.none and a.sync([(a.member_id, b"a")]) == ErrorCode.none
        # B joins: a rebalance in which A rejoins, then both sync (the leader with both assignments).
        joined = {}
        thread = threading.Thread(target=lambda: joined.setdefault("b", b.join(session_ms=6000, rebalance_ms=6000)))
        thread.start()
        wait_until(lambda: a.heartbeat() == ErrorCode.rebalance_in_progress, what="B's join to start a rebalance",
                   timeout_s=30)
        assert a.join(session_ms=6000, rebalance_ms=6000).error_code == ErrorCode.none
        thread.join(30)
        assert joined["b"].error_code == ErrorCode.none
        leader, other = (a, b) if a.leader == a.member_id else (b, a)
        sync_other = threading.Thread(target=other.sync)
        sync_other.start()
        assert leader.sync([(a.member_id, b"a"), (b.member_id, b"b")]) == ErrorCode.none
        sync_other.join(30)
        assert a.heartbeat() == ErrorCode.none and b.heartbeat() == ErrorCode.none

        # The wall clock steps an hour ahead. A heartbeats (waking the coordinator's timer), then B.
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + HOUR_S)
        assert a.heartbeat() == ErrorCode.none
        time.sleep(0.5)
        assert b.heartbeat() == ErrorCode.none, "a step of the wall clock expired a member's session"
        assert a.heartbeat() == ErrorCode.none
    finally:
        monkeypatch.undo()
        for member in (a, b):
            if member is not None:
                member.close()
        live.stop()
