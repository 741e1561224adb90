"""copyless: a Kafka-protocol message-log broker, and its asyncio client.

The installed distribution has one import name. The client's public API is re-exported here::

    from copyless import Producer, Consumer, Admin

The broker lives in ``copyless.broker`` (``copyless serve``), the client in ``copyless.client``. In the
repository they are the top-level folders ``broker/`` and ``client/``, mapped under ``copyless`` by
``pyproject.toml``'s package-dir.
"""

from importlib.metadata import PackageNotFoundError, version as _version

from copyless.client import *  # noqa: F401,F403  (the public client API)
from copyless.client import __all__ as _client_all

try:
    __version__ = _version("copyless")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [*_client_all, "__version__"]
