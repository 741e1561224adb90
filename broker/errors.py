"""Broker errors and the one map from an exception to the Kafka error code a client expects.

Owns: ``BrokerError`` (an operation refused, carrying its Kafka ``ErrorCode`` and a message for the client
and the log), the named subclasses request handlers and the partition layer raise, and ``error_for``, the
single place where exceptions from other layers become error codes:

    BrokerError and subclasses ........................ their own code
    storage.OffsetOutOfRangeError ...................... OFFSET_OUT_OF_RANGE (1)
    storage.StorageError (ENOSPC, EIO, invariants) .... KAFKA_STORAGE_ERROR (56)
    records.InvalidBatchError (a stored batch that
    does not decode on a timestamp lookup) ............ CORRUPT_MESSAGE (2)

Handlers never catch storage exceptions themselves: they catch ``Exception`` around one partition's work
and ask ``error_for``. Anything else (a bug) is not mapped: ``error_for`` re-raises it, the connection's
shell logs the traceback and closes the connection, which every client treats as a retriable network error.

Pure: imports kio's error table and nothing of the broker's shell.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "BrokerError",
    "NotLeaderOrFollower",
    "FencedLeaderEpoch",
    "UnknownLeaderEpoch",
    "UnknownTopicOrPartition",
    "NotEnoughReplicas",
    "NotEnoughReplicasAfterAppend",
    "LeaderNotAvailable",
    "OffsetNotAvailable",
    "RequestTimedOut",
    "error_for",
]


class BrokerError(Exception):
    """An operation refused with the Kafka error ``code``; ``message`` goes to the client where the API has
    an error message field, and to the log."""

    code: ErrorCode = ErrorCode.unknown_server_error

    def __init__(self, code_or_message, message: str | None = None) -> None:
        if isinstance(code_or_message, ErrorCode):
            code, text = code_or_message, message if message is not None else code_or_message.name
        else:
            code, text = type(self).code, code_or_message
        super().__init__(text)
        self.code = code
        self.message = text


class NotLeaderOrFollower(BrokerError):
    code = ErrorCode.not_leader_or_follower


class FencedLeaderEpoch(BrokerError):
    code = ErrorCode.fenced_leader_epoch


class UnknownLeaderEpoch(BrokerError):
    code = ErrorCode.unknown_leader_epoch


class UnknownTopicOrPartition(BrokerError):
    code = ErrorCode.unknown_topic_or_partition


class NotEnoughReplicas(BrokerError):
    code = ErrorCode.not_enough_replicas


class NotEnoughReplicasAfterAppend(BrokerError):
    code = ErrorCode.not_enough_replicas_after_append


class LeaderNotAvailable(BrokerError):
    code = ErrorCode.leader_not_available


class OffsetNotAvailable(BrokerError):
    code = ErrorCode.offset_not_available


class RequestTimedOut(BrokerError):
    code = ErrorCode.request_timed_out


def error_for(exc: BaseException) -> tuple[ErrorCode, str]:
    """``(code, message)`` for an exception a partition operation raised.

    Raises:
        the exception itself when it is not a known failure (a bug must surface, not become an error code).
    """
    if isinstance(exc, BrokerError):
        return exc.code, exc.message
    # Imported here: the storage package pulls in mmap and threads, and the wire-level tests import this
    # module without it.
    from copyless.broker.storage.errors import OffsetOutOfRangeError, StorageError
    from copyless.protocol.records import InvalidBatchError

    if isinstance(exc, OffsetOutOfRangeError):
        return ErrorCode.offset_out_of_range, str(exc)
    if isinstance(exc, StorageError):
        return ErrorCode.kafka_storage_error, f"storage error: {exc}"
    if isinstance(exc, InvalidBatchError):
        return ErrorCode.corrupt_message, f"stored batch does not decode: {exc}"
    raise exc
