"""The LogConfig the storage and transaction tests share: ``SMALL``, segments small enough that a test of a
few hundred batches rolls several of them.

Segments of 64 KiB allocated in 16 KiB steps (a 4 MiB first step and 64 MiB ahead in production), with a
16 KiB pre-fault window floor (16 MiB in production), so that the steps, their sparse tails and the moving
windows are all exercised within small segments. Tests that need other sizes build their own LogConfig (or
``dataclasses.replace`` this one); the ``manager_factory`` and ``small_config`` fixtures (tests/conftest.py)
start LogManagers with it.
"""

from __future__ import annotations

from copyless.broker.storage import LogConfig

__all__ = ["SMALL"]

SMALL = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, index_interval_bytes=512, retention_ms=None,
                  preallocate_first_bytes=16 << 10, preallocate_ahead_bytes=48 << 10, prefault_window_bytes=16 << 10)
