"""The asyncio shell: raw non-blocking sockets, one task per connection, sendfile for records.

``run(config)`` is the whole process: load state, pick the event loop, serve until SIGTERM/SIGINT. The names
load on first use (PEP 562), so ``copyless --version`` and the client commands, which import ``server.cli``
to register ``serve``, do not load the broker (seconds of imports on a loaded machine).
"""

__all__ = ["Server", "run", "serve"]


def __getattr__(name: str):
    if name in ("run", "serve"):
        from copyless.broker.server import app

        return getattr(app, name)
    if name == "Server":
        from copyless.broker.server.server import Server

        return Server
    raise AttributeError(f"module 'copyless.broker.server' has no attribute {name!r}")
