"""The listener, the connection tasks, periodic work and graceful shutdown.

Lifecycle:

1. ``Broker.startup()`` (blocking, before the loop runs): identity, topics, logs, recovery, producer state.
2. ``Server.start()``: bind every listener (``--listener NAME=HOST:PORT``, or the one ``--listen``), join the
   cluster (the registration names the bound endpoints; the first metadata image is applied), run the
   handler startup hooks (groups), print the startup line ``copyless listening on HOST:PORT ...`` on stdout
   (tests read the port from it), accept.
3. Accept loops, one per listener: every connection is a raw non-blocking socket (TCP_NODELAY) served by
   its own task, and knows its listener (Metadata answers with that listener's advertised addresses).
4. ``Server.shutdown()`` on SIGTERM/SIGINT: stop accepting; answer parked long-poll fetches now; let every
   in-flight request finish (bounded by ``shutdown_timeout_s``); close connections; run handler shutdown
   hooks; leave the cluster (the lease is revoked, so the partitions this broker led move at once);
   ``LogManager.shutdown()`` in a worker thread (flush, checkpoint, clean-shutdown marker).

Counters: ``broker.stats``; SIGUSR1 and shutdown print them as one ``stats-json {...}`` line on stdout, and
``--metrics-listen`` serves them to Prometheus (``metrics_http``), started after the startup hooks and closed
first at shutdown.
Periodic work: the stats log line every ``stats_interval_s``, the idle reaper and the loop-lag probe. Flush
policy, retention and recovery-point checkpoints run on the storage's own housekeeping thread (they fsync
and unlink; never on the loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from copyless.broker.server.connection import Connection
from copyless.broker.state import Broker

if TYPE_CHECKING:
    from copyless.broker.server.metrics_http import MetricsServer

__all__ = ["Server", "ListenError"]

log = logging.getLogger("copyless.server")

# Kafka's default socket listen backlog is 50; 1024 absorbs a burst of thousands of connects (the
# many-connections benchmark opens 10,000).
LISTEN_BACKLOG = 1024
# How often the loop-lag probe wakes (see Server._lag_probe).
LAG_PROBE_INTERVAL_S = 0.1


class ListenError(OSError):
    """An address could not be bound; the message names which (a Kafka listener, or metrics.listen) and why."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        reason = os.strerror(cause.errno).lower() if cause.errno else str(cause)
        super().__init__(cause.errno, f"cannot listen on {what} {host}:{port}: {reason}")


class Server:
    def __init__(self, broker: Broker, *, loop_name: str = "asyncio") -> None:
        self.broker = broker
        self.config = broker.config
        self.use_sendfile = broker.config.sendfile
        self.loop_name = loop_name
        self.closing = False
        self.listen_socket: socket.socket | None = None
        self.listen_sockets: dict[str, socket.socket] = {}
        self.bound_host = ""
        self.bound_port = 0
        self.connections: dict[int, tuple[Connection, asyncio.Task]] = {}
        self._next_connection_id = 0
        self._accept_tasks: list[asyncio.Task] = []
        self._periodic: list[asyncio.Task] = []
        self._stopped = asyncio.Event()
        self._last_accept_warning = 0.0
        self.metrics: MetricsServer | None = None  # the /metrics endpoint (--metrics-listen), once started

    # --- start -----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every listener, join the cluster (registration names the bound endpoints), run the handlers'
        startup hooks, then accept. Raises ListenError naming the listener or metrics.listen that cannot bind."""
        config = self.config
        for name, host, port in config.listener_specs():
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(LISTEN_BACKLOG)
            except OSError as exc:
                sock.close()
                self._close_listeners()
                raise ListenError(f"listener {name}", host, port, exc) from exc
            sock.setblocking(False)
            self.listen_sockets[name] = sock
            bound_host, bound_port = sock.getsockname()[:2]
            if host in ("0.0.0.0", "::", ""):
                # A wildcard address is not one a client can connect to; Kafka advertises the host's name then.
                bound_host = socket.getfqdn()
            self.broker.bound_listeners[name] = (bound_host, bound_port)
        first = next(iter(self.listen_sockets.values()))
        self.listen_socket = first
        self.bound_host, self.bound_port = first.getsockname()[:2]
        changes: dict[str, Any] = {}
        if self.config.listen_port == 0 and not self.config.listeners:
            # Port 0: advertise the port the kernel chose (unless an advertised port was configured).
            changes["listen_port"] = self.bound_port
        if self.config.advertise_host is None and self.config.listen_host in ("0.0.0.0", "::", "") \
                and not self.config.listeners:
            changes["advertise_host"] = socket.getfqdn()
        if changes:
            self.broker.config = dataclasses.replace(self.broker.config, **changes)
            self.config = self.broker.config
        await self.broker.start_cluster()
        await self.broker.run_startup_hooks()
        if config.metrics_listen is not None:
            from copyless.broker.server.metrics_http import MetricsServer

            self.metrics = MetricsServer(self.broker)
            try:
                await self.metrics.start(*config.metrics_listen)
            except OSError as exc:
                self._close_listeners()
                raise ListenError("metrics.listen", *config.metrics_listen, exc) from exc
        for name, sock in self.listen_sockets.items():
            self._accept_tasks.append(
                asyncio.create_task(self._accept_loop(name, sock), name=f"copyless-accept-{name}"))
        if self.config.stats_interval_s > 0:
            self._periodic.append(asyncio.create_task(self._stats_loop(), name="copyless-stats"))
        if self.config.connections_max_idle_ms:
            self._periodic.append(asyncio.create_task(self._idle_reaper(self.config.connections_max_idle_ms),
                                                      name="copyless-idle-reaper"))
        self._periodic.append(asyncio.create_task(self._lag_probe(), name="copyless-loop-lag"))
        self._periodic.append(asyncio.create_task(self._producer_expiry(), name="copyless-producer-expiry"))
        self._announce()

    async def abandon_start(self) -> None:
        """After ``start()`` was cancelled (a signal during start-up): close what it opened, leave the cluster
        if it had joined. The logs are the caller's to close."""
        for task in (*self._accept_tasks, *self._periodic):
            task.cancel()
        self._close_listeners()
        if self.metrics is not None:
            await self.metrics.close()
        await self.broker.stop_cluster()

    def _close_listeners(self) -> None:
        for sock in self.listen_sockets.values():
            try:
                sock.close()
            except OSError:
                pass

    def _announce(self) -> None:
        """The startup line on stdout (short: where to connect and how to stop), and every setting that
        shapes behaviour in the log."""
        config = self.broker.config
        advertised = self.broker.advertised_listeners()
        listeners = " ".join(
            f"{name}={host}:{port}->{advertised[name][0]}:{advertised[name][1]}"
            for name, (host, port) in ((name, sock.getsockname()[:2]) for name, sock in self.listen_sockets.items()))
        mode = f"cluster {self.broker.cluster_id} via {config.metadata}" if config.clustered else "single node"
        security = self.broker.security.summary()
        security = f"; {security}" if security else ""
        print(f"copyless listening on {self.bound_host}:{self.bound_port} (node {self.broker.node_id}, {mode}, "
              f"data in {config.data_dir}{security}); Ctrl-C or SIGTERM stops it cleanly", flush=True)
        log.info(
            "serving: listeners=%s advertised=%s:%d data_dir=%s loop=%s sendfile=%s flush_mode=%s segment_bytes=%d "
            "socket_send_buffer_bytes=%d retention_ms=%s max_message_bytes=%d auto_create_topics=%s num_partitions=%d "
            "node_id=%d cluster_id=%s metadata=%s",
            listeners, config.advertised_host, config.advertised_port, config.data_dir, self.loop_name,
            "on" if self.use_sendfile else "off", config.flush_mode, config.segment_bytes,
            config.socket_send_buffer_bytes, config.retention_ms, config.message_max_bytes,
            config.auto_create_topics, config.num_partitions, self.broker.node_id, self.broker.cluster_id,
            config.metadata or "embedded")
        if config.security.values or config.security.add_scram:
            log.info("security: %s; kTLS %s (%s); settings %s", self.broker.security.summary() or "PLAINTEXT only",
                     "available" if self.broker.security.ktls.available else "not available",
                     self.broker.security.ktls.reason, config.security.describe())

    # --- accept --------------------------------------------------------------------------------------------------

    async def _accept_loop(self, listener: str, listen_socket: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        stats = self.broker.stats
        while not self.closing:
            try:
                sock, address = await loop.sock_accept(listen_socket)
            except asyncio.CancelledError:
                return
            except OSError as exc:
                # EMFILE/ENFILE: out of descriptors. Back off instead of spinning; existing clients go on.
                # One log line per burst, not one per refused connection.
                now = time.monotonic()
                if now - self._last_accept_warning > 10:
                    self._last_accept_warning = now
                    log.warning("accept failed: %s (%d connections open); backing off", exc, len(self.connections))
                await asyncio.sleep(0.1)
                continue
            if self.closing:
                sock.close()
                return
            sock.setblocking(False)
            self._tune(sock)
            self._next_connection_id += 1
            connection_id = self._next_connection_id
            connection = Connection(self, sock, address, connection_id, listener)
            stats.connections_accepted += 1
            stats.connections_open += 1
            task = asyncio.create_task(connection.run(), name=f"copyless-conn-{connection_id}")
            self.connections[connection_id] = (connection, task)
            task.add_done_callback(functools.partial(self._forget_connection, connection_id))

    def _forget_connection(self, connection_id: int, _task: object) -> None:
        self.connections.pop(connection_id, None)

    def _tune(self, sock: socket.socket) -> None:
        """TCP_NODELAY, and the configured socket buffers (see BrokerConfig.socket_send_buffer_bytes)."""
        config = self.broker.config
        options = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        if config.socket_send_buffer_bytes != -1:
            options.append((socket.SOL_SOCKET, socket.SO_SNDBUF, config.socket_send_buffer_bytes))
        if config.socket_receive_buffer_bytes != -1:
            options.append((socket.SOL_SOCKET, socket.SO_RCVBUF, config.socket_receive_buffer_bytes))
        for level, option, value in options:
            try:
                sock.setsockopt(level, option, value)
            except OSError as exc:  # an option the platform refuses is no reason to drop the client
                log.debug("setsockopt(%s, %s) failed on an accepted connection: %s", option, value, exc)

    # --- periodic work ---------------------------------------------------------------------------------------------

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_s)
            log.info("%s", self.broker.stats.log_line())

    async def _lag_probe(self) -> None:
        """Record how late a 100 ms sleep wakes up (``stats.loop_lag``). Ten timer wake-ups a second cost
        nothing measurable; a loop held by blocking work, or a loop thread the kernel did not run, shows up
        as lag that every connection felt."""
        # time.monotonic, not loop.time(): uvloop's clock is libuv's millisecond tick, cached per iteration.
        lag = self.broker.stats.loop_lag
        while True:
            due = time.monotonic() + LAG_PROBE_INTERVAL_S
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            lag.record(max(0.0, time.monotonic() - due))

    async def _producer_expiry(self) -> None:
        """Kafka's producer.id.expiration.check.interval.ms: every interval, forget the producers idle past
        producer.id.expiration.ms (``Broker.expire_producers``; read each time, so a change applies)."""
        while True:
            await asyncio.sleep(self.broker.config.producer_id_expiration_check_interval_ms / 1000)
            try:
                await self.broker.expire_producers(int(time.time() * 1000))
            except Exception:
                log.exception("expiring producers failed")

    async def _idle_reaper(self, max_idle_ms: int) -> None:
        """Close connections without a request for connections.max.idle.ms (Kafka's default: 10 minutes), so
        abandoned clients do not hold descriptors forever. A sweep costs O(connections) every tenth of the
        limit (at most every 30 s): 10,000 connections take about a millisecond."""
        loop = asyncio.get_running_loop()
        limit_s = max_idle_ms / 1000
        while True:
            await asyncio.sleep(min(max(limit_s / 10, 0.05), 30.0))
            now = loop.time()
            for connection, task in list(self.connections.values()):
                if not connection.busy and now - connection.last_active > limit_s:
                    log.info("closing connection from %s (client_id=%s): idle for more than %.0f ms",
                             connection.peer, connection.client_id, limit_s * 1000)
                    task.cancel()

    # --- shutdown -------------------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop accepting, finish in-flight requests, close connections, shut the logs down cleanly."""
        if self.closing:
            await self._stopped.wait()
            return
        started = time.monotonic()
        self.closing = True
        self.broker.closing = True
        log.info("shutting down: %d connection(s) open", len(self.connections))
        for task in self._accept_tasks:
            task.cancel()
        self._close_listeners()
        for task in self._periodic:
            task.cancel()
        if self.metrics is not None:
            await self.metrics.close()
        if self.config.clustered:
            # Hand leadership over first: the lease goes, the controller moves this broker's partitions at
            # once, and requests waiting on them answer NOT_LEADER_OR_FOLLOWER, so clients move on.
            await self.broker.stop_cluster()
        # Parked long-poll fetches answer now with what they have.
        self.broker.appends.wake_all()
        for connection, task in list(self.connections.values()):
            if not connection.busy:
                task.cancel()
        busy = [task for _c, task in self.connections.values()]
        if busy:
            _done, pending = await asyncio.wait(busy, timeout=self.config.shutdown_timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d request(s) did not finish within %.0f s; cancelled",
                            len(pending), self.config.shutdown_timeout_s)
                await asyncio.wait(pending, timeout=5)
        await self.broker.run_shutdown_hooks()
        await self.broker.stop_cluster()
        self.broker.snapshot_producer_state()
        await asyncio.to_thread(self.broker.shutdown_logs)
        log.info("%s", self.broker.stats.log_line())
        print("stats-json " + json.dumps(self.broker.stats_snapshot(), sort_keys=True), flush=True)
        log.info("shutdown complete in %.0f ms (clean-shutdown marker written)", (time.monotonic() - started) * 1000)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
