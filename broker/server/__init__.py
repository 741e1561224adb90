"""The asyncio shell: raw non-blocking sockets, one task per connection, sendfile for records.

``run(config)`` is the whole process: load state, pick the event loop, serve until SIGTERM/SIGINT.
"""

from copyless.broker.server.app import run, serve
from copyless.broker.server.server import Server

__all__ = ["Server", "run", "serve"]
