"""Client errors: one exception tree, with Kafka error codes named and classified from ``kio``'s table.

``KafkaError(code)`` carries the broker's error code; ``retriable`` comes from Kafka's own classification
(``Errors.java``, as generated into ``kio.schema.errors.ErrorCode``), so the producer retries exactly the
errors the Java client retries. Local misuse raises ``ValueError``/``TypeError`` or the named errors below.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = [
    "ClientError",
    "KafkaError",
    "KafkaConnectionError",
    "NotKafkaError",
    "KafkaTimeoutError",
    "BufferFullError",
    "ProducerClosedError",
    "UnsupportedVersionError",
    "TransactionStateError",
    "TransactionAbortableError",
    "TransactionFatalError",
    "ProducerFencedError",
    "error_name",
]


class ClientError(Exception):
    """Base of every error raised by the copyless client."""


class KafkaError(ClientError):
    """The broker answered with a non-zero error code."""

    def __init__(self, code: int, context: str = "") -> None:
        self.code = int(code)
        self.name = error_name(self.code)
        self.context = context
        try:
            self.retriable = bool(ErrorCode(self.code).retriable)
        except ValueError:
            self.retriable = False
        super().__init__(f"{self.name} ({self.code})" + (f": {context}" if context else ""))


class KafkaConnectionError(ClientError):
    """A connection could not be made or was lost; in-flight requests on it fail with this."""

    retriable = True


class NotKafkaError(KafkaConnectionError):
    """The peer accepted the connection but did not answer the ApiVersions handshake as a Kafka broker does:
    it sent bytes that are not a Kafka response (an HTTP or TLS server), or nothing within the handshake
    timeout. A client that has never reached a broker fails at once with it instead of retrying."""


class KafkaTimeoutError(ClientError):
    """A request or an operation did not complete within its timeout."""

    retriable = True


class BufferFullError(ClientError):
    """``send_nowait`` found the producer's ``buffer_memory`` exhausted (back-pressure)."""


class ProducerClosedError(ClientError):
    """The producer was closed before the record could be sent."""


class UnsupportedVersionError(ClientError):
    """The broker does not support a version of an API the client needs."""


class TransactionStateError(ClientError):
    """A transactional call made in the wrong state (``send`` before ``begin_transaction``, ``commit`` with
    no transaction open, a non-transactional producer asked to begin one): Kafka's IllegalStateException."""


class TransactionAbortableError(ClientError):
    """The open transaction cannot commit (a batch failed, a partition or the group could not be added):
    call ``abort_transaction`` and start again. ``cause`` is the error behind it."""

    def __init__(self, message: str, cause: BaseException | None) -> None:
        super().__init__(message)
        self.cause = cause


class TransactionFatalError(ClientError):
    """The transactional producer cannot go on (authorization, a broken transaction state): close it.
    ``cause`` is the error behind it."""

    def __init__(self, message: str, cause: BaseException | None) -> None:
        super().__init__(message)
        self.cause = cause


class ProducerFencedError(TransactionFatalError):
    """A newer producer with the same transactional id (or the coordinator's timeout abort) fenced this one
    (PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH before KIP-588): close it; its open transaction is aborted."""


def error_name(code: int) -> str:
    """Kafka's upper-case name for an error code (``UNKNOWN_TOPIC_OR_PARTITION``), or ``UNKNOWN_<code>``."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_{code}"
