"""Waiting for something outside the test to happen: the suite's polling loops.

A broker, a client process or the kernel updates state on its own schedule (a counter bumped just after
the bytes left, a topic created asynchronously, a log line written on an interval). Tests ask again until
the condition holds, and fail with a message that names what they waited for, never by waiting out a
fixed sleep.

Three shapes, each written once:

- ``wait_until`` / ``wait_until_async``: ask until a condition holds, fail naming what was awaited.
- ``holds_for``: a check that must keep passing for a while (no leader is elected, nothing moves).
- ``gather`` / ``gather_async``: call a client's poll until enough items came back or the time is up, and
  return what came; the caller compares it with what was written, so a shortfall shows what is missing.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def _timed_out(what: str, timeout_s: float, detail: Callable[[], str] | None) -> AssertionError:
    message = f"timed out after {timeout_s:g} s waiting for {what}"
    if detail is not None:
        message += f"\n{detail()}"
    return AssertionError(message)


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
            raise _timed_out(what, timeout_s, detail)
        time.sleep(interval_s)


async def wait_until_async(condition: Callable[[], T | Awaitable[T]], *, what: str, timeout_s: float,
                           interval_s: float = 0.05, detail: Callable[[], str] | None = None) -> T:
    """``wait_until`` inside an event loop: sleeps with ``asyncio.sleep``, and ``condition`` may be a
    coroutine function (its per-call work, such as a consumer's poll, is awaited before the answer is read)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, detail)
        await asyncio.sleep(interval_s)


def holds_for(check: Callable[[], object], *, seconds: float, interval_s: float = 0.2) -> None:
    """Call ``check`` (which asserts) every ``interval_s`` for ``seconds``: a state that must not change, such
    as a partition staying leaderless across several of the controller's rounds. Its first failure fails."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check()
        time.sleep(interval_s)


def gather(fetch: Callable[[], Iterable[T]], *, count: int, timeout_s: float) -> list[T]:
    """Call ``fetch`` (a client's poll, which waits up to its own short timeout) and keep what it returns
    until ``count`` items arrived or ``timeout_s`` passed. Returns everything, possibly fewer than ``count``."""
    out: list[T] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out.extend(fetch())
    return out


async def gather_async(fetch: Callable[[], Awaitable[Iterable[T]]], *, count: int, timeout_s: float) -> list[T]:
    """``gather`` for an asyncio client: ``fetch`` is a coroutine function (``consumer.getmany``'s records)."""
    out: list[T] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out.extend(await fetch())
    return out
