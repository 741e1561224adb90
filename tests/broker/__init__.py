"""The broker end to end in process (real sockets, real data dirs) and its layers: wire, handlers, server."""
