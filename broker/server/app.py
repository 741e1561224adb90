"""Process entry: load the broker state, choose the event loop, serve until a signal, shut down cleanly.

``run(config)`` blocks and returns the exit code. ``serve(broker, loop_name)`` is the coroutine, usable by
tests that start a broker inside their own event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal

from copyless.broker.config import BrokerConfig
from copyless.broker.server.server import ListenError, Server
from copyless.broker.state import Broker
from copyless.broker.storage import blocking

__all__ = ["run", "serve", "loop_factory"]

log = logging.getLogger("copyless.server")


def loop_factory(name: str):
    """The event-loop factory for ``--loop``: uvloop's when asked and installed, else asyncio's."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed; using the asyncio event loop")
            return asyncio.new_event_loop, "asyncio"
        return uvloop.new_event_loop, "uvloop"
    return asyncio.new_event_loop, "asyncio"


async def serve(broker: Broker, loop_name: str, *, started: asyncio.Future | None = None) -> Server:
    """Start serving and wait for SIGTERM/SIGINT (or ``server.shutdown()``); returns the stopped server."""
    # While serving, the storage's blocking work must stay off this thread (storage/blocking.py checks it);
    # once the loop is done, this thread may block again (a failed start closes the logs on it).
    blocking.set_loop_thread()
    if broker.config.check_loop_blocking:
        blocking.enable()
    try:
        return await _serve(broker, loop_name, started)
    finally:
        blocking.clear_loop_thread()


class StoppedDuringStartup(Exception):
    """SIGTERM or SIGINT arrived before the broker was serving: start-up was abandoned, and what it had opened
    is closed (the caller closes the logs)."""


async def _serve(broker: Broker, loop_name: str, started: asyncio.Future | None) -> Server:
    server = Server(broker, loop_name=loop_name)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    start_task = asyncio.ensure_future(server.start())

    def request_stop() -> None:
        stop_requested.set()
        if not start_task.done():
            start_task.cancel()

    # Installed before start() prints the startup line: a SIGTERM sent the moment the line appears shuts the
    # broker down cleanly instead of killing it with the default action (a test that stopped a broker at once
    # saw exit status -15), and one sent during start-up (a cluster broker waiting for etcd) abandons it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, request_stop)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests): shutdown() is called directly
    # SIGUSR1: write the counters now, as one JSON line (a subprocess test or an operator can ask any time).
    try:
        loop.add_signal_handler(signal.SIGUSR1, _log_stats_json, broker)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    try:
        try:
            await start_task
        except asyncio.CancelledError:
            if not stop_requested.is_set():
                raise
            log.info("signal received during start-up: stopping")
            await server.abandon_start()
            raise StoppedDuringStartup() from None
        if started is not None and not started.done():
            started.set_result(server)
        stop_task = asyncio.create_task(stop_requested.wait())
        stopped_task = asyncio.create_task(server.wait_stopped())
        await asyncio.wait({stop_task, stopped_task}, return_when=asyncio.FIRST_COMPLETED)
        if stop_requested.is_set():
            log.info("signal received: graceful shutdown")
            await server.shutdown()
        stop_task.cancel()
        stopped_task.cancel()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            try:
                loop.remove_signal_handler(signum)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
    return server


def raise_open_files_limit() -> tuple[int, int]:
    """Lift the soft RLIMIT_NOFILE to the hard limit: every client connection is a descriptor, and the
    many-connections target (10,000 idle clients) is far above the usual soft limit of 1024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        return soft, hard
    except (ImportError, ValueError, OSError):
        return -1, -1


def _log_stats_json(broker: Broker) -> None:
    line = "stats-json " + json.dumps(broker.stats_snapshot(), sort_keys=True)
    print(line, flush=True)
    log.info("%s", line)


# glibc malloc tuning for the produce path. Every produce request allocates and frees a few buffers of
# about the request's size (the frame, kio's records bytes); with glibc's defaults such 1 MiB blocks are
# mmap'ed, freed with munmap and faulted in again on the next request: 35% of broker CPU went to page faults
# and page zeroing. Keeping blocks below 32 MiB on the heap and returning free heap to the kernel only
# above 128 MiB measured 2.3-2.6 -> 0.7-1.4 CPU-s per GB produced (1 MiB batches of 10 KB records).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # mallopt(3) parameter numbers
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20
MALLOC_TRIM_THRESHOLD_BYTES = 128 << 20


def apply_mallopt(settings) -> bool:
    """``mallopt(param, value)`` for each ``(param, value)`` in ``settings`` (glibc only; a no-op elsewhere).
    True when every setting took. The throughput benchmark's consumer processes use it too."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all([mallopt(param, value) == 1 for param, value in settings])


def tune_malloc() -> bool:
    """Apply the broker's thresholds above. True when applied."""
    return apply_mallopt(((M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
                          (M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES)))


def run(config: BrokerConfig) -> int:
    """Load, serve, shut down. Blocking; returns the process exit code (1 when startup fails)."""
    from copyless.broker.cluster.etcd_metadata import DuplicateBrokerError
    from copyless.broker.meta_properties import ClusterMismatchError
    from copyless.broker.storage import StorageError

    factory, loop_name = loop_factory(config.loop)
    open_files, _hard = raise_open_files_limit()
    log.info("open files limit %d; malloc tuned: %s", open_files, tune_malloc())
    broker = Broker(config)
    try:
        broker.startup()
    except (StorageError, ValueError, OSError) as exc:
        log.error("startup failed: %s", exc)
        return 1
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(broker, loop_name))
    except StoppedDuringStartup:
        broker.shutdown_logs()
        log.info("stopped before serving; logs closed cleanly")
        return 0
    except ListenError as exc:
        # An address is taken or not local; the logs were loaded, so close them cleanly.
        log.error("%s", exc.strerror)
        broker.shutdown_logs()
        return 1
    except OSError as exc:
        log.error("cannot serve on %s:%d: %s", config.listen_host, config.listen_port, exc.strerror or exc)
        broker.shutdown_logs()
        return 1
    except (ClusterMismatchError, DuplicateBrokerError) as exc:
        # The cluster refused this broker: say why, without a traceback; nothing was served.
        log.error("cannot join the cluster: %s", exc)
        broker.shutdown_logs()
        return 1
    except Exception:
        # A startup hook (e.g. loading committed offsets) failed before the listener opened.
        log.exception("broker failed before serving; closing the logs")
        broker.shutdown_logs()
        return 1
    return 0
