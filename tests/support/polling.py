"""Waiting for something outside the test to happen: the suite's one polling loop.

A broker, a client process or the kernel updates state on its own schedule (a counter bumped just after
the bytes left, a topic created asynchronously, a log line written on an interval). Tests ask again until
the condition holds, and fail with a message that names what they waited for, never by waiting out a
fixed sleep.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, what: str, timeout_s: float, interval_s: float = 0.05,
               detail: Callable[[], str] | None = None) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Args:
        condition: asked at once, then every ``interval_s``; an exception it raises fails the wait at once.
        what: what is awaited, for the failure message ("the group coordinator to load").
        timeout_s: how long to keep asking.
        detail: called once on timeout; its text (a log tail, the last value seen) goes under the message.

    Raises:
        AssertionError: the condition was still falsy after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"timed out after {timeout_s:g} s waiting for {what}"
            if detail is not None:
                message += f"\n{detail()}"
            raise AssertionError(message)
        time.sleep(interval_s)
