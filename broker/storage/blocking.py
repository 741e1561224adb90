"""The loop-thread guard: a blocking storage call made on the event loop's thread raises, when enabled.

Storage runs its appends and reads on the event loop's thread and everything that can block (posix_fallocate,
fdatasync, pre-faulting, unlink, waiting for another thread) on its worker threads. A blocking call that
slips onto the loop thread stalls every connection of the broker for its duration: a posix_fallocate of a
step took 1-8 ms here under load, an fdatasync hundreds. The rule is easy to break without noticing (a
fallback path taken once in a thousand rolls), so the blocking primitives call ``check`` first.

``check`` is one comparison of globals when disabled. ``enable`` arms it (the test suite does, for its own
process and, through ``copyless serve --check-loop-blocking``, for every broker it starts);
``set_loop_thread`` names the thread (the asyncio shell calls it when it starts serving; storage never
imports asyncio and does not know which thread runs the loop). An armed check that fails logs the call and
raises ``BlockingCallError``: a bug in the broker, never an error a client can cause.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["BlockingCallError", "check", "enable", "disable", "enabled", "set_loop_thread", "clear_loop_thread"]

log = logging.getLogger("copyless.storage")

_enabled = False
_loop_thread: int | None = None


class BlockingCallError(AssertionError):
    """A blocking storage call was made on the event loop's thread while the guard was armed."""


def enable() -> None:
    """Arm the guard (the test suite; ``copyless serve --check-loop-blocking``)."""
    global _enabled
    _enabled = True


def disable() -> None:
    global _enabled
    _enabled = False


def enabled() -> bool:
    return _enabled


def set_loop_thread(ident: int | None = None) -> None:
    """Name the event loop's thread (default: the calling one). The asyncio shell calls it as it starts."""
    global _loop_thread
    _loop_thread = threading.get_ident() if ident is None else ident


def clear_loop_thread() -> None:
    global _loop_thread
    _loop_thread = None


def check(what: str) -> None:
    """Raise BlockingCallError if the guard is armed and this is the event loop's thread.

    Args:
        what: the blocking call about to be made, for the message ("posix_fallocate", "fdatasync", ...).
    """
    if not _enabled or _loop_thread is None or threading.get_ident() != _loop_thread:
        return
    message = f"blocking storage call on the event loop's thread: {what}"
    log.error("%s", message, stack_info=True)
    raise BlockingCallError(message)
