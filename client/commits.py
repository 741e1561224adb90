"""The consumer's committed offsets: OffsetCommit v3 and OffsetFetch v3 through the group coordinator.

Owns committing positions (on demand, and every ``auto_commit_interval_ms`` with auto-commit, skipping
partitions whose position has not moved since their last commit) and reading the group's committed
offsets. Requests go through ``GroupCoordinator.request``, which finds the coordinator again and retries
when it moved or its connection was lost; a commit made as a member of the group carries its generation
and member id, and an answer of REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID marks
the member for a rejoin. Loop thread only.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

from kio.schema.offset_commit.v3.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_commit.v3.response import OffsetCommitResponse
from kio.schema.offset_fetch.v3.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.offset_fetch.v3.response import OffsetFetchResponse
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64, i64Timedelta

from copyless.client.assignors import TopicPartition
from copyless.client.errors import KafkaError

__all__ = ["OffsetCommits"]

log = logging.getLogger("copyless.client.consumer")

ILLEGAL_GENERATION = 22
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27
_REJOIN_ERRORS = {ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS}


class OffsetCommits:
    """Commits and committed-offset lookups for one group.

    Args:
        coordinator: the group's ``GroupCoordinator``.
        membership: the ``GroupMembership`` when subscribed (its generation and member id go with each
            commit), or None for a consumer with manual assignment (generation -1, as Kafka allows).
        auto_commit_interval_ms: 0 or less disables auto-commit.
    """

    def __init__(self, coordinator, membership, *, auto_commit_interval_ms: int) -> None:
        self.coordinator = coordinator
        self.membership = membership
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._last_commit = 0.0
        self._committed: dict[TopicPartition, int] = {}
        self._task: asyncio.Task | None = None

    async def commit(self, offsets: dict[TopicPartition, int], *, only_changed: bool = False) -> None:
        """Commit ``{TopicPartition: offset}``; ``only_changed`` leaves out offsets already committed.

        Raises:
            KafkaError: e.g. REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION (the member then rejoins), or a
                coordinator error that outlasted the request timeout.
        """
        if only_changed:
            offsets = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if not offsets:
            return
        topics: dict[str, list] = {}
        for tp, offset in offsets.items():
            topics.setdefault(tp.topic, []).append(
                OffsetCommitRequestPartition(partition_index=i32(tp.partition), committed_offset=i64(offset),
                                             committed_metadata="")
            )
        membership = self.membership
        request = OffsetCommitRequest(
            group_id=self.coordinator.group_id,
            generation_id_or_member_epoch=i32(membership.generation if membership is not None else -1),
            member_id=membership.member_id if membership is not None else "",
            retention_time=i64Timedelta.parse(datetime.timedelta(milliseconds=-1)),
            topics=tuple(OffsetCommitRequestTopic(name=TopicName(t), partitions=tuple(p)) for t, p in topics.items()),
        )

        def check(response) -> None:
            for topic in response.topics:
                for partition in topic.partitions:
                    code = int(partition.error_code)
                    if code != 0:
                        if code in _REJOIN_ERRORS and membership is not None:
                            membership.rejoin_needed = True
                        raise KafkaError(code, f"OffsetCommit {topic.name}-{partition.partition_index}")

        await self.coordinator.request(request, OffsetCommitResponse, check)
        self._committed.update(offsets)

    async def fetch(self, tps) -> dict[TopicPartition, int | None]:
        """The group's committed offsets of ``tps`` (None where nothing was committed)."""
        if not tps:
            return {}
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)

        def check(response) -> None:
            if int(response.error_code) != 0:
                raise KafkaError(int(response.error_code), "OffsetFetch")

        response = await self.coordinator.request(
            OffsetFetchRequest(
                group_id=self.coordinator.group_id,
                topics=tuple(OffsetFetchRequestTopic(name=TopicName(t), partition_indexes=tuple(map(i32, p)))
                             for t, p in topics.items()),
            ),
            OffsetFetchResponse,
            check,
        )
        out = {}
        for topic in response.topics:
            for partition in topic.partitions:
                offset = int(partition.committed_offset)
                out[TopicPartition(topic.name, int(partition.partition_index))] = offset if offset >= 0 else None
        return out

    def maybe_auto_commit(self, positions) -> None:
        """Commit ``positions()`` in the background when the auto-commit interval has passed (at most one
        commit in flight)."""
        if self.auto_commit_interval_ms <= 0:
            return
        now = time.monotonic()
        if now - self._last_commit < self.auto_commit_interval_ms / 1000:
            return
        if self._task is not None and not self._task.done():
            return
        self._last_commit = now
        self._task = asyncio.get_running_loop().create_task(self._auto_commit(positions()))

    async def _auto_commit(self, offsets) -> None:
        try:
            await self.commit(offsets, only_changed=True)
        except Exception as exc:
            log.info("auto-commit failed: %s", exc)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
