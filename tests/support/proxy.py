"""A TCP proxy that cuts connections on demand, for testing what clients do when the network fails.

``CuttingProxy(target)`` listens on 127.0.0.1 (a port of its own, chosen before the broker starts so the
broker can ``--advertise`` it and every client connection goes through the proxy) and forwards bytes both
ways with one thread per direction. ``cut()`` resets every open connection at once (SO_LINGER 0: the
client sees ECONNRESET, as after a broker's kill -9 or a dropped route), so requests in flight lose their
responses: a produce the broker applied is retried by the client, a fetch is sent again.
"""

from __future__ import annotations

import socket
import struct
import threading

__all__ = ["CuttingProxy"]


class CuttingProxy:
    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.cuts = 0
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, target: tuple[str, int]) -> CuttingProxy:
        self.target = target
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(256 * 1024)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        _reset(source)
        _reset(sink)

    def cut(self) -> int:
        """Reset every open connection; returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
            self.cuts += len(pairs)
        for client, upstream in pairs:
            _reset(client)
            _reset(upstream)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
