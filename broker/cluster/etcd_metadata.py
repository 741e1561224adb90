"""EtcdMetadata: the clustered backend. Brokers register in etcd, elect a controller through it, and learn
every topic, assignment and partition state from it (the layout: ``broker.cluster.keys``).

Start-up (``start``): reach etcd (retrying with backoff, saying why); read or create the cluster id and
check it against the data dir's ``meta.properties`` (a data dir of another cluster refuses to start);
register under a new lease; read everything under the cluster's prefix at one revision; publish that image;
then watch from the next revision, keep the lease alive, and stand for controller whenever there is none.

Registration. The broker key lives on this broker's lease; its create revision is the broker epoch. A key
already there means another process holds this node id: if it carries this data dir's ``directory.id`` it
is this broker's own previous process (the data dir's lock proves that process is gone), and its lease is
revoked so its partitions move at once; otherwise the key is waited for for one lease time (a crashed
process's lease expires), and if it is still there the broker refuses to start: two live brokers with one
id would be two leaders for the same partitions. The registration names ``previous_epoch``, the epoch whose
data this process holds in full (a clean shutdown, a restart in the same boot, or this process's own
earlier registration; else -1), and each registration is recorded in the data dir: ISR entries of an
earlier epoch hold only for a broker that vouches for it (``broker.cluster.incarnation``).

The lease. ``lease_valid()`` is true only until ``granted TTL`` after the last keepalive that etcd
answered, counted from when that keepalive was sent, on CLOCK_BOOTTIME (``lease_clock``: a suspended
machine's monotonic clock stops, etcd's does not): etcd cannot expire the lease earlier than that, so a
broker that stops acting as leader at that instant never overlaps with a successor the controller elects
after the expiry. Cut off from etcd, a broker thus keeps serving what it leads until its lease would have
expired, then refuses (NOT_LEADER_OR_FOLLOWER, and Metadata no longer names it leader). If the lease turns
out gone when etcd answers again, the broker first demotes every partition it leads, then registers anew
(a new broker epoch), and follows the controller's new decisions.

Watching. The image is rebuilt from the watched keys after each watch response and published to the replica
manager; its revision only grows, so this broker never reports an older leader epoch than it did. When etcd
restarts the watch resumes from the last revision seen + 1; if etcd compacted that revision away, the
broker reloads everything at a new revision. Neither ever deletes data: only an image that lacks a topic
(or has it under another topic id) makes the replica manager delete its logs.

Standing for controller: whenever the image shows no controller and the lease is valid. An election's
transaction can commit while its answer is lost; the image then names this broker on its own lease, and it
takes office from there (``broker.cluster.controller``, "An election whose answer was lost"), so a lost
answer never leaves the cluster without a controller.

Requests that change the cluster (create / delete topics, add partitions, preferred elections) are carried
out by the controller; on another broker they are forwarded to it over its inter-broker listener (Kafka's
KIP-590 forwarding), and answered once this broker's own image shows the change. Config changes need no
placement: any broker writes them, conditional on the key being what it last saw (a topic's key by value,
a dynamic broker config key by revision), and every broker applies them from its image.

The produce and fetch paths make no etcd call: ``lease_valid`` reads a clock; ISR changes are the only
writes a leader makes, when a follower falls behind or catches up.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i16, i32, i32Timedelta

from copyless.broker._files import write_atomically
from copyless.broker.cluster import etcd_client as etcd
from copyless.broker.cluster import incarnation
from copyless.broker.cluster.backend import MetadataBackend, NewTopic, inter_broker_client_id
from copyless.broker.cluster.controller import Controller
from copyless.broker.cluster.image import ClusterImage, TopicInfo
from copyless.broker.cluster.keys import (
    Layout,
    decode_broker,
    decode_image,
    decode_isr_epochs,
    decode_state,
    encode_broker,
    encode_state,
    encode_topic,
)
from copyless.broker.meta_properties import META_FILE, ClusterMismatchError, read_meta
from copyless.broker.partition import PartitionState
from copyless.broker.topics import TopicError

__all__ = ["EtcdMetadata", "DuplicateBrokerError", "parse_metadata_url"]

log = logging.getLogger("copyless.metadata")

DEFAULT_ROOT = "copyless"
# Producer ids are reserved cluster-wide in blocks of this many (Kafka's controller hands out 1000).
PRODUCER_ID_BLOCK = 1000
# How long a CreateTopics / DeleteTopics answer waits for this broker's image to show the change.
PROPAGATION_TIMEOUT_S = 10.0
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0


def lease_clock() -> float:
    """Seconds on CLOCK_BOOTTIME, the clock lease deadlines run on: unlike CLOCK_MONOTONIC it keeps counting
    while the machine is suspended, as etcd's clock does, so a broker that wakes from a suspend longer than
    its lease knows the lease may be gone instead of acting on it for the rest of its TTL."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)



@contextlib.contextmanager
def _etcd_trouble_answered():
    """The controller's etcd write did not get through (etcd electing a leader, a member down): the client
    gets REQUEST_TIMED_OUT, which every Kafka admin client retries, instead of a closed connection. The
    write may or may not have happened; the retry finds out (TOPIC_ALREADY_EXISTS and the like)."""
    try:
        yield
    except etcd.EtcdUnavailable as exc:
        raise TopicError(ErrorCode.request_timed_out, f"the metadata store did not answer ({exc}); retry") from None


class DuplicateBrokerError(RuntimeError):
    """Another live broker is registered with this node id."""


def parse_metadata_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://h:p[,h:p...][/root]`` -> (endpoints, root). Raises ValueError."""
    if not url.startswith("etcd://"):
        raise ValueError(f"metadata URL must start with etcd://, got {url!r}")
    rest = url[len("etcd://"):]
    hosts, _, root = rest.partition("/")
    root = root.strip("/") or DEFAULT_ROOT
    if "/" in root or not root:
        raise ValueError(f"bad root {root!r} in {url!r} (one path segment)")
    return etcd.parse_endpoints(hosts), root


class EtcdMetadata(MetadataBackend):
    """The clustered backend (module docstring). ``broker`` provides config, node_id, data_dir, replicas,
    appends, advertised_listeners() and check_or_write_meta()."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.node_id = broker.node_id
        config = broker.config
        endpoints, root = parse_metadata_url(config.metadata)
        self.ttl_s = max(2, math.ceil(config.broker_session_timeout_ms / 1000))
        # A call waits at most a third of the lease: a slow member must not hold the keepalive past it.
        self.client = etcd.EtcdClient(endpoints, timeout_s=max(0.5, self.ttl_s / 3))
        self.layout = Layout(root)
        self.image = ClusterImage()
        self.lease_id = 0
        self.broker_epoch = 0
        self.directory_id = ""
        # The epoch whose data this process holds in full, named in its next registration (incarnation.py).
        self._previous_epoch = -1
        self._boot_id = ""
        self._lease_deadline = 0.0
        self._registered = False
        self._kvs: dict[bytes, etcd.KeyValue] = {}
        self._isr_written: dict[bytes, etcd.KeyValue] = {}  # this broker's last ISR write per partition key
        self._revision = 0
        self._tasks: list[asyncio.Task] = []
        self._waiters: list[tuple[Callable[[ClusterImage], bool], asyncio.Future]] = []
        self._campaigning = False
        self._stopping = False
        self._producer_ids = (0, 0)  # [next, end) of this broker's current block
        self._producer_id_lock: asyncio.Lock | None = None
        self._forward: Any = None  # a client connection to the controller, for forwarded requests
        self._forward_target: tuple[int, tuple[str, int]] | None = None
        self.controller = Controller(self)
        # Called with (every key under the prefix, revision) after each new view: the security store reads
        # its keys from the same watch (broker.security.store).
        self.kv_listeners: list[Callable[[dict, int], None]] = []
        self.stats = {"etcd_reads": 0, "etcd_writes": 0, "watch_resumes": 0, "reloads": 0, "registrations": 0,
                      "isr_writes": 0, "isr_writes_refused": 0, "forwarded": 0}

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def is_controller(self) -> bool:
        return self.controller.active

    def lease_valid(self) -> bool:
        return self._registered and lease_clock() < self._lease_deadline

    # --- start-up ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the cluster (module docstring). Raises ClusterMismatchError, DuplicateBrokerError."""
        delay = RETRY_MIN_S
        while True:
            try:
                cluster_id = await self._cluster_id()
                break
            except etcd.EtcdUnavailable as exc:
                log.error("cannot reach etcd at %s (%s); retrying in %.1f s",
                          ", ".join(f"{h}:{p}" for h, p in self.client.endpoints), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        await asyncio.to_thread(self._check_data_dir, cluster_id)
        self.layout = Layout(self.layout.root, cluster_id)
        await self._retrying(self._register)
        await self._retrying(self._reload)
        await self.broker.replicas.wait_applied(self.image.revision)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keepalive(), name="copyless-etcd-keepalive"),
                       loop.create_task(self._watch(), name="copyless-etcd-watch")]
        self._maybe_campaign()
        log.info("node %d joined cluster %s (broker epoch %d, %d broker(s) live, controller %d)", self.node_id,
                 cluster_id, self.broker_epoch, len(self.image.brokers), self.image.controller_id)

    async def _retrying(self, step) -> None:
        delay = RETRY_MIN_S
        while True:
            try:
                return await step()
            except etcd.EtcdUnavailable as exc:
                log.error("etcd unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _cluster_id(self) -> str:
        """The cluster id stored in etcd, created by the first broker (or the configured one)."""
        key = self.layout.cluster_id_key
        configured = self.broker.config.cluster_id
        current, _ = await self.client.get(key)
        self.stats["etcd_reads"] += 1
        if current is None:
            proposed = configured or base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            result = await self.client.txn([etcd.created(key, 0)], [etcd.put(key, proposed.encode())],
                                           [etcd.get(key)])
            self.stats["etcd_writes"] += 1
            cluster_id = proposed if result.succeeded else result.ranges[0][0].value.decode()
            if result.succeeded:
                log.info("created cluster %s in etcd under /%s", cluster_id, self.layout.root)
        else:
            cluster_id = current.value.decode()
        if configured and configured != cluster_id:
            raise ClusterMismatchError(f"cluster.id is {configured} but the cluster in etcd under /{self.layout.root} "
                                       f"is {cluster_id}; refusing to start")
        return cluster_id

    def _check_data_dir(self, cluster_id: str) -> None:
        """Blocking: meta.properties must name this cluster (or be new); it also keeps the directory id."""
        self.broker.check_or_write_meta(cluster_id)
        path = self.broker.data_dir / META_FILE
        properties = read_meta(path)
        directory_id = properties.get("directory.id")
        if not directory_id:
            directory_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
            properties["directory.id"] = directory_id
            write_atomically(path, "".join(f"{k}={v}\n" for k, v in properties.items()).encode())
        self.directory_id = directory_id
        self._boot_id = incarnation.boot_id()
        record = incarnation.read_record(self.broker.data_dir)
        storage = getattr(self.broker.log_manager, "startup_stats", {}) or {}
        self._previous_epoch = incarnation.previous_epoch(record, clean_shutdown=bool(storage.get("clean")),
                                                          current_boot_id=self._boot_id)
        if record is not None:
            log.info("previous incarnation: broker epoch %d; %s", record.broker_epoch,
                     "its data is all here (a clean shutdown or the same boot): its ISR entries carry over"
                     if self._previous_epoch > 0 else
                     "its data may be incomplete (no clean shutdown, another boot): it rejoins ISRs by "
                     "catching up")

    async def _register(self) -> None:
        """Register this broker under a new lease (module docstring, "Registration")."""
        key = self.layout.broker(self.node_id)
        value = encode_broker(self.broker.advertised_listeners(), self.directory_id,
                              previous_epoch=self._previous_epoch)
        waited_from = None
        while True:
            existing, _ = await self.client.get(key)
            self.stats["etcd_reads"] += 1
            if existing is not None:
                _info, directory_id = decode_broker(self.node_id, existing)
                if directory_id == self.directory_id:
                    log.info("revoking the registration of this broker's previous process (lease %x)", existing.lease)
                    await self.client.revoke(existing.lease)
                    continue
                waited_from = waited_from or time.monotonic()
                if time.monotonic() - waited_from > self.ttl_s + 2:
                    raise DuplicateBrokerError(
                        f"another broker is registered with node id {self.node_id} (endpoints "
                        f"{_info.endpoints}, data dir id {directory_id}); refusing to start: two brokers with one "
                        f"id would both act for the same partitions")
                await asyncio.sleep(0.25)
                continue
            sent = lease_clock()
            lease_id, ttl = await self.client.grant(self.ttl_s)
            result = await self.client.txn([etcd.created(key, 0)], [etcd.put(key, value, lease_id)])
            self.stats["etcd_writes"] += 2
            if not result.succeeded:
                await self.client.revoke(lease_id)
                continue
            # Leadership from before this registration is not this process's (ReplicaManager docstring):
            # demote first, then let the lease count as valid.
            self.broker.replicas.new_broker_epoch(result.revision)
            self.lease_id, self.broker_epoch = lease_id, result.revision
            self._lease_deadline = sent + ttl
            self._registered = True
            self.stats["registrations"] += 1
            log.info("node %d registered: broker epoch %d (continuing %d), lease %x (%d s)", self.node_id,
                     self.broker_epoch, self._previous_epoch, lease_id, ttl)
            # This process holds its own data in full: a later re-registration (a lost lease) continues it.
            self._previous_epoch = self.broker_epoch
            await self._record_incarnation()
            # The watch may have shown the controller gone while this broker had no valid lease to stand with.
            self._maybe_campaign()
            return

    async def _record_incarnation(self) -> None:
        try:
            await asyncio.to_thread(incarnation.write_record, self.broker.data_dir,
                                    incarnation.Incarnation(self.broker_epoch, self._boot_id))
        except OSError as exc:
            # The older record stays: it names an epoch the ISRs stop using, which costs availability after
            # a restart, never safety (incarnation.py).
            log.warning("could not record broker epoch %d in the data dir: %s", self.broker_epoch, exc)

    async def _keepalive(self) -> None:
        interval_s = self.ttl_s / 3
        while not self._stopping:
            await asyncio.sleep(interval_s if self.lease_valid() else 0.1)
            sent = lease_clock()
            try:
                ttl = await self.client.keepalive(self.lease_id, timeout_s=interval_s)
            except etcd.EtcdUnavailable as exc:
                if self.lease_valid():
                    log.warning("lease keepalive failed (%s); the lease holds for %.1f s more", exc,
                                self._lease_deadline - lease_clock())
                continue
            except Exception:
                log.exception("lease keepalive failed")
                continue
            if ttl > 0:
                self._lease_deadline = sent + ttl
                # A backstop for elections: an image without a controller is also re-checked here, so a
                # watch event that arrived while the lease was not valid is not the only chance to stand.
                self._maybe_campaign()
                continue
            # The lease is gone: etcd expired it while this broker could not reach it.
            log.warning("node %d lost its lease (broker epoch %d); every partition it led has moved; "
                        "registering again", self.node_id, self.broker_epoch)
            self._registered = False
            self.controller.resign("lease lost")
            try:
                await self._register()
            except etcd.EtcdUnavailable as exc:
                log.warning("re-registration failed (%s); retrying", exc)
            except DuplicateBrokerError as exc:
                log.error("%s", exc)

    # --- the image -------------------------------------------------------------------------------------------------

    async def _reload(self) -> None:
        kvs, revision = await self.client.get_prefix(self.layout.prefix)
        self.stats["etcd_reads"] += 1
        self._kvs = {kv.key: kv for kv in kvs}
        self._revision = max(self._revision, revision)
        self._publish()

    def _publish(self) -> None:
        for listener in self.kv_listeners:
            listener(self._kvs, self._revision)
        image = decode_image(self.layout, self._kvs.values(), self._revision)
        self.image = image
        self.broker.replicas.publish(image)
        self.controller.on_image(image)
        self._maybe_take_office()
        still = []
        for predicate, future in self._waiters:
            if future.done():
                continue
            if predicate(image):
                future.set_result(image)
            else:
                still.append((predicate, future))
        self._waiters = still
        self._maybe_campaign()

    async def _watch(self) -> None:
        delay = RETRY_MIN_S
        while not self._stopping:
            try:
                async for revision, events in self.client.watch_prefix(self.layout.prefix, self._revision + 1):
                    delay = RETRY_MIN_S
                    if events:
                        for is_put, kv in events:
                            if is_put:
                                self._kvs[kv.key] = kv
                            else:
                                self._kvs.pop(kv.key, None)
                        # Resume after the last event delivered, not the header's revision: later events of
                        # this prefix may still be on their way.
                        self._revision = max(self._revision, max(kv.mod_revision for _p, kv in events))
                        self._publish()
                    else:
                        self._revision = max(self._revision, revision)
            except etcd.WatchCompacted as exc:
                log.warning("etcd compacted revision %d away (%s): reloading the cluster metadata",
                            self._revision + 1, exc)
                self.stats["reloads"] += 1
                try:
                    await self._reload()
                except etcd.EtcdUnavailable:
                    await asyncio.sleep(delay)
            except etcd.EtcdUnavailable as exc:
                if self._stopping:
                    return
                self.stats["watch_resumes"] += 1
                log.warning("etcd watch interrupted (%s); resuming from revision %d in %.1f s", exc,
                            self._revision + 1, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("etcd watch failed; resuming")
                await asyncio.sleep(delay)

    async def wait_for(self, predicate: Callable[[ClusterImage], bool], timeout_s: float) -> ClusterImage:
        """Until this broker's image satisfies ``predicate``. Raises TimeoutError."""
        if predicate(self.image):
            return self.image
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((predicate, future))
        async with asyncio.timeout(timeout_s):
            return await future

    # --- the controller ---------------------------------------------------------------------------------------

    def _maybe_take_office(self) -> None:
        """The image names this broker controller, but it is not acting: its election committed and the
        answer was lost (controller module docstring). Take office when the key is on this broker's lease
        and the controller-epoch key was written by the same transaction (its mod_revision is the token)."""
        if self.controller.active or self.image.controller_id != self.node_id or not self.lease_valid():
            return
        key = self._kvs.get(self.layout.controller)
        epoch = self._kvs.get(self.layout.controller_epoch)
        if key is None or epoch is None or key.lease != self.lease_id or epoch.mod_revision != key.mod_revision:
            return
        try:
            value = int(epoch.value)
        except ValueError:
            return
        self.controller.take_office(value, epoch.mod_revision, "took office from the watched election key (the "
                                                               "election's answer was lost)")

    def _maybe_campaign(self) -> None:
        if self.image.controller_id >= 0 or self._campaigning or self._stopping or not self.lease_valid():
            return
        self._campaigning = True
        asyncio.get_running_loop().create_task(self._campaign(), name="copyless-campaign")

    async def _campaign(self) -> None:
        try:
            await self.controller.campaign()
            self.stats["etcd_writes"] += 1
        except etcd.EtcdUnavailable as exc:
            log.info("controller election attempt failed: %s", exc)
        finally:
            self._campaigning = False

    async def _controller_request(self, request, response_cls):
        """Send a kio request to the controller over its inter-broker listener (forwarding)."""
        from copyless.client.conn import Connection

        image = self.image
        controller = image.brokers.get(image.controller_id)
        listener = self.broker.config.inter_broker_listener_name
        if controller is None or listener not in controller.endpoints:
            raise TopicError(ErrorCode.not_controller, "no controller is known right now; retry")
        target = (controller.node_id, controller.endpoints[listener])
        if self._forward is None or self._forward.closed or self._forward_target != target:
            if self._forward is not None:
                self._forward.close()
            host, port = target[1]
            self._forward = await Connection.open(host, port, client_id=inter_broker_client_id(self.node_id),
                                                  request_timeout_ms=30_000,
                                                  security=self.broker.security.inter_broker_client())
            self._forward_target = target
        self.stats["forwarded"] += 1
        return await self._forward.request_kio(request, response_cls)

    # --- topics -------------------------------------------------------------------------------------------------

    async def create_topic(self, new: NewTopic, *, validate_only: bool = False) -> TopicInfo:
        if self.controller.active:
            with _etcd_trouble_answered():
                info, revision = await self.controller.create_topic(new, validate_only=validate_only)
        else:
            info = await self._forward_create(new, validate_only)
        if validate_only:
            return info
        try:
            await self.wait_for(lambda image: info.name in image.topics, PROPAGATION_TIMEOUT_S)
        except TimeoutError:
            log.warning("topic %s was created but this broker has not seen it yet", info.name)
        return self.image.topics.get(info.name, info)

    async def _forward_create(self, new: NewTopic, validate_only: bool) -> TopicInfo:
        import datetime

        from kio.schema.create_topics.v4.request import (
            CreatableReplicaAssignment,
            CreatableTopic,
            CreatableTopicConfig,
            CreateTopicsRequest,
        )
        from kio.schema.create_topics.v4.response import CreateTopicsResponse
        from kio.schema.types import BrokerId, TopicName

        assignments = tuple(
            CreatableReplicaAssignment(partition_index=i32(index), broker_ids=tuple(BrokerId(b) for b in replicas))
            for index, replicas in sorted((new.assignments or {}).items()))
        topic = CreatableTopic(
            name=TopicName(new.name), num_partitions=i32(new.partitions if not assignments else -1),
            replication_factor=i16(new.replication_factor if not assignments else -1), assignments=assignments,
            configs=tuple(CreatableTopicConfig(name=k, value=v) for k, v in new.configs.items()))
        request = CreateTopicsRequest(topics=(topic,), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                                      validate_only=validate_only)
        try:
            response = await self._controller_request(request, CreateTopicsResponse)
        except TopicError:
            raise
        except Exception as exc:
            raise TopicError(ErrorCode.not_controller, f"forwarding to the controller failed: {exc}") from None
        result = response.topics[0]
        if result.error_code != ErrorCode.none:
            raise TopicError(ErrorCode(result.error_code), result.error_message or ErrorCode(result.error_code).name)
        if validate_only:
            from copyless.broker.cluster.image import TopicInfo as _TopicInfo

            return _TopicInfo(new.name, uuid.uuid4(), ())
        image = await self.wait_for(lambda image: new.name in image.topics, PROPAGATION_TIMEOUT_S)
        return image.topics[new.name]

    async def delete_topic(self, name: str) -> None:
        info = self.image.topic(name)
        if self.controller.active:
            with _etcd_trouble_answered():
                await self.controller.delete_topic(name)
        else:
            import datetime

            from kio.schema.delete_topics.v3.request import DeleteTopicsRequest
            from kio.schema.delete_topics.v3.response import DeleteTopicsResponse
            from kio.schema.types import TopicName

            try:
                response = await self._controller_request(
                    DeleteTopicsRequest(topic_names=(TopicName(name),),
                                        timeout=i32Timedelta.parse(datetime.timedelta(seconds=30))),
                    DeleteTopicsResponse)
            except TopicError:
                raise
            except Exception as exc:
                raise TopicError(ErrorCode.not_controller, f"forwarding to the controller failed: {exc}") from None
            code = ErrorCode(response.responses[0].error_code)
            if code != ErrorCode.none:
                raise TopicError(code, code.name)
        self.broker.appends.notify_topic(name)
        topic_id = info.topic_id if info is not None else None
        try:
            await self.wait_for(lambda image: image.topics.get(name) is None or image.topics[name].topic_id != topic_id,
                                PROPAGATION_TIMEOUT_S)
        except TimeoutError:
            log.warning("topic %s was deleted but this broker has not seen it yet", name)

    # --- partitions -----------------------------------------------------------------------------------------------

    async def alter_isr(self, topic: str, partition: int, state: PartitionState, isr: tuple[int, ...],
                        joining_epochs: Mapping[int, int] | None = None) -> PartitionState | None:
        """A leader's ISR change (Kafka before KIP-497's AlterPartition: the leader writes the state itself),
        conditional on the state's version and on this broker's registration being the one it had.

        Members that stay keep the broker epoch they were admitted under; a joining member is admitted under
        the epoch in ``joining_epochs`` (the one its fetch named, KIP-903), and without one it is refused."""
        layout = self.layout
        new = PartitionState(state.leader, state.leader_epoch, tuple(isr), state.replicas)
        key = layout.partition(topic, partition)
        # The state the change was made from: as watched, or as this broker last wrote it (its own write's
        # event may still be on its way).
        current = next((kv for kv in (self._kvs.get(key), self._isr_written.get(key))
                        if kv is not None and kv.mod_revision == state.version), None)
        if current is None:
            # The compare below would refuse it: the image is ahead of (or behind) the state it was made from.
            self.stats["isr_writes_refused"] += 1
            return None
        data = json.loads(current.value)
        controller_epoch = int(data.get("controller_epoch", -1))
        kept = decode_isr_epochs(current.value)
        epochs = {}
        for member in new.isr:
            if member in state.isr:
                epochs[member] = kept.get(member, 0)
            elif joining_epochs and member in joining_epochs:
                epochs[member] = joining_epochs[member]
            else:
                self.stats["isr_writes_refused"] += 1
                return None
        value = encode_state(new, controller_epoch, epochs)
        result = await self.client.txn(
            [etcd.modified(key, state.version), etcd.created(layout.broker(self.node_id), self.broker_epoch)],
            [etcd.put(key, value)])
        self.stats["etcd_writes"] += 1
        self.stats["isr_writes"] += 1
        if not result.succeeded:
            self.stats["isr_writes_refused"] += 1
            return None
        self._isr_written[key] = etcd.KeyValue(key, value, current.create_revision, result.revision)
        return PartitionState(new.leader, new.leader_epoch, new.isr, new.replicas, result.revision)

    async def read_partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """A linearizable read of the partition's state key (etcd's default Range): ``version`` is its
        mod_revision, as in the image."""
        info = self.image.topic(topic)
        if info is None or not 0 <= partition < len(info.assignment):
            return None
        kv, _revision = await self.client.get(self.layout.partition(topic, partition))
        if kv is None:
            return None
        return decode_state(kv.value, tuple(info.assignment[partition]), kv.mod_revision)[0]

    async def elect_preferred_leaders(self, partitions=None) -> dict:
        if self.controller.active:
            with _etcd_trouble_answered():
                return await self.controller.elect_preferred(partitions)
        import datetime

        from kio.schema.elect_leaders.v1.request import ElectLeadersRequest, TopicPartitions
        from kio.schema.elect_leaders.v1.response import ElectLeadersResponse
        from kio.schema.types import TopicName

        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions or ():
            by_topic.setdefault(topic, []).append(index)
        request = ElectLeadersRequest(
            election_type=i8(0), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            topic_partitions=None if partitions is None else tuple(
                TopicPartitions(topic=TopicName(t), partitions=tuple(map(i32, p))) for t, p in by_topic.items()))
        try:
            response = await self._controller_request(request, ElectLeadersResponse)
        except TopicError:
            raise
        except Exception as exc:
            raise TopicError(ErrorCode.not_controller, f"forwarding to the controller failed: {exc}") from None
        if response.error_code != ErrorCode.none:
            raise TopicError(ErrorCode(response.error_code), ErrorCode(response.error_code).name)
        outcome = {(result.topic, p.partition_id): ErrorCode(p.error_code)
                   for result in response.replica_election_results for p in result.partition_result}
        moved = {key for key, code in outcome.items() if code == ErrorCode.none}
        if moved:
            try:
                await self.wait_for(lambda image: all((state := image.partition_state(*key)) is not None and
                                                       state.leader ==
                                                       image.topics[key[0]].assignment[key[1]][0]
                                                       for key in moved), PROPAGATION_TIMEOUT_S)
            except (TimeoutError, KeyError):
                pass
        return outcome

    async def create_partitions(self, name: str, count: int, assignments: Sequence[Sequence[int]] | None = None,
                                *, validate_only: bool = False) -> TopicInfo:
        if self.controller.active:
            with _etcd_trouble_answered():
                info, _revision = await self.controller.create_partitions(name, count, assignments,
                                                                          validate_only=validate_only)
        else:
            info = await self._forward_create_partitions(name, count, assignments, validate_only)
        if validate_only:
            return info
        try:
            await self.wait_for(lambda image: name in image.topics and image.topics[name].partitions >= count,
                                PROPAGATION_TIMEOUT_S)
        except TimeoutError:
            log.warning("partitions were added to %s but this broker has not seen them yet", name)
        return self.image.topics.get(name, info)

    async def _forward_create_partitions(self, name, count, assignments, validate_only) -> TopicInfo:
        import datetime

        from kio.schema.create_partitions.v1.request import (
            CreatePartitionsAssignment,
            CreatePartitionsRequest,
            CreatePartitionsTopic,
        )
        from kio.schema.create_partitions.v1.response import CreatePartitionsResponse
        from kio.schema.types import BrokerId, TopicName

        topic = CreatePartitionsTopic(
            name=TopicName(name), count=count,
            assignments=None if assignments is None else tuple(
                CreatePartitionsAssignment(broker_ids=tuple(BrokerId(b) for b in replicas))
                for replicas in assignments))
        request = CreatePartitionsRequest(topics=(topic,), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                                          validate_only=validate_only)
        try:
            response = await self._controller_request(request, CreatePartitionsResponse)
        except TopicError:
            raise
        except Exception as exc:
            raise TopicError(ErrorCode.not_controller, f"forwarding to the controller failed: {exc}") from None
        result = response.results[0]
        if result.error_code != ErrorCode.none:
            raise TopicError(ErrorCode(result.error_code), result.error_message or ErrorCode(result.error_code).name)
        return self.image.topics.get(name) or TopicInfo(name, uuid.uuid4(), ())

    # --- configs ---------------------------------------------------------------------------------------------

    async def alter_topic_configs(self, name: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        """Rewrite the topic key with ``configs``, conditional on it holding what this broker's image says
        (a concurrent change or a deletion in between refuses it; the client retries)."""
        current = self.image.topic(name)
        if current is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist.")
        if validate_only:
            return
        layout = self.layout
        updated = TopicInfo(name=current.name, topic_id=current.topic_id, assignment=current.assignment,
                            configs=dict(configs), internal=current.internal)
        result = await self.client.txn([etcd.value_is(layout.topic(name), encode_topic(current))],
                                       [etcd.put(layout.topic(name), encode_topic(updated))])
        self.stats["etcd_writes"] += 1
        if not result.succeeded:
            raise TopicError(ErrorCode.invalid_request, f"Topic '{name}' changed meanwhile; retry")
        try:
            await self.wait_for(lambda image: (topic := image.topic(name)) is not None and
                                dict(topic.configs) == dict(configs), PROPAGATION_TIMEOUT_S)
        except TimeoutError:
            log.warning("configs of %s were altered but this broker has not seen it yet", name)

    async def alter_broker_configs(self, key: str, configs: Mapping[str, str], *, validate_only: bool = False) -> None:
        """Write (or delete, when empty) the dynamic configs of ``key``, conditional on the key's revision
        this broker last saw."""
        if validate_only:
            return
        path = self.layout.broker_configs(key)
        seen = self._kvs.get(path)
        compare = [etcd.modified(path, seen.mod_revision if seen is not None else 0)]
        operation = etcd.put(path, json.dumps(dict(configs), sort_keys=True).encode()) if configs else etcd.delete(path)
        result = await self.client.txn(compare, [operation])
        self.stats["etcd_writes"] += 1
        if not result.succeeded:
            raise TopicError(ErrorCode.invalid_request, "the broker configs changed meanwhile; retry")
        wanted = dict(configs)
        try:
            await self.wait_for(lambda image: dict(image.broker_configs.get(key, {})) == wanted,
                                PROPAGATION_TIMEOUT_S)
        except TimeoutError:
            log.warning("broker configs %r were altered but this broker has not seen it yet", key)

    # --- producer ids ------------------------------------------------------------------------------------------

    async def allocate_producer_id(self) -> int:
        """An id from this broker's block; a new block is reserved in etcd (compare-and-set) when it runs out,
        so no two brokers, and no restart, ever hand out the same id."""
        if self._producer_id_lock is None:
            self._producer_id_lock = asyncio.Lock()
        async with self._producer_id_lock:
            next_id, end = self._producer_ids
            if next_id >= end:
                key = self.layout.producer_id_block
                while True:
                    current, _ = await self.client.get(key)
                    start = int(current.value) if current is not None else 0
                    start = max(start, self.broker.producers.max_producer_id() + 1)
                    result = await self.client.txn(
                        [etcd.modified(key, current.mod_revision if current is not None else 0)],
                        [etcd.put(key, str(start + PRODUCER_ID_BLOCK).encode())])
                    self.stats["etcd_writes"] += 1
                    if result.succeeded:
                        next_id, end = start, start + PRODUCER_ID_BLOCK
                        break
            self._producer_ids = (next_id + 1, end)
            return next_id

    # --- shutdown -----------------------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Give the lease up (the partitions this broker led move at once) and stop watching."""
        self._stopping = True
        self.controller.resign("shutting down")
        registered, self._registered = self._registered, False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if registered and self.lease_id:
            try:
                await self.client.revoke(self.lease_id)
            except Exception as exc:
                log.info("revoking the lease failed (%s); it expires by itself", exc)
        if self._forward is not None:
            self._forward.close()
        for _predicate, future in self._waiters:
            if not future.done():
                future.cancel()
        await self.client.close()
