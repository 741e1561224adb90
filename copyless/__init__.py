"""copyless: a Kafka-protocol message-log broker, and its asyncio client.

The installed distribution has one import name. The client's public API is re-exported here::

    from copyless import Producer, Consumer, Admin

The broker lives in ``copyless.broker`` (``copyless serve``), the client in ``copyless.client``. In the
repository they are the top-level folders ``broker/`` and ``client/``, mapped under ``copyless`` by
``pyproject.toml``'s package-dir. The re-exports are loaded on first use (PEP 562), so importing
``copyless.broker`` does not load the client and its codecs.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("copyless")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"

from copyless.client import __all__ as _client_api

__all__ = [*_client_api, "__version__"]


def __getattr__(name: str):
    if name in _client_api:
        import copyless.client

        return getattr(copyless.client, name)
    raise AttributeError(f"module 'copyless' has no attribute {name!r}")
