"""Where SCRAM credentials and ACL bindings live: with the cluster's metadata, as Kafka keeps them in its
metadata log (``UserScramCredentialRecord``, ``AccessControlEntryRecord``).

Two backends behind one interface (``SecurityStore``), chosen with the metadata backend:

- ``EmbeddedSecurityStore`` (single node): ``<data_dir>/security.json``::

      {"version": 1,
       "scram": {"alice": {"SCRAM-SHA-512": {"salt": b64, "stored_key": b64, "server_key": b64,
                                              "iterations": 4096}}},
       "acls": [{"resource_type": "TOPIC", "resource_name": "orders", "pattern_type": "LITERAL",
                 "principal": "User:alice", "host": "*", "operation": "READ", "permission": "ALLOW"}]}

  written whole (tmp + fsync + rename, mode 0600) on each change, on a worker thread, under a lock so writes
  land in the order the changes were made. Crash story: the file is the old one or the new one; a change is
  answered only after its rename, so an acknowledged change survives a crash.
- ``EtcdSecurityStore`` (cluster): one key per credential and per binding, under the cluster's prefix::

      /<root>/<cluster id>/scram/<user, %-quoted>/<mechanism>    the credential JSON above
      /<root>/<cluster id>/acls/<sha-256 of the binding's JSON>   the binding JSON

  Any broker writes them (an ACL key is its binding's hash, so creating one twice is one key; a credential
  key is overwritten: the last AlterUserScramCredentials wins, as in Kafka's log). Every broker learns them
  from the metadata watch it already runs (``EtcdMetadata.kv_listeners``), and a change is answered once
  this broker's own view shows it, so a client that changes an ACL and then reads through this broker sees
  its change. Other brokers see it within their watch's delay (milliseconds). Bootstrap credentials are
  created only where the key does not exist (compare create_revision 0), so brokers starting together with
  the same ``--add-scram`` do not overwrite a password changed since.

Only salts, iterations, StoredKey and ServerKey are kept: never a password (``protocol.scram``).
Loop thread; file writes on worker threads.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from copyless.broker.security.acl import AclBinding, AclError
from copyless.protocol.scram import ScramCredential

__all__ = ["SecurityStore", "EmbeddedSecurityStore", "EtcdSecurityStore", "SECURITY_FILE", "encode_credential",
           "decode_credential", "StoreError"]

log = logging.getLogger("copyless.security")

SECURITY_FILE = "security.json"
# How long a change waits for this broker's view of etcd to show it before answering anyway.
PROPAGATION_TIMEOUT_S = 10.0
MAX_TXN_OPS = 100


class StoreError(RuntimeError):
    """A change could not be made (the metadata store did not answer); it may or may not have happened."""


def encode_credential(credential: ScramCredential) -> dict:
    return {"salt": base64.b64encode(credential.salt).decode(), "iterations": credential.iterations,
            "stored_key": base64.b64encode(credential.stored_key).decode(),
            "server_key": base64.b64encode(credential.server_key).decode()}


def decode_credential(data: dict) -> ScramCredential:
    """Raises ValueError / KeyError / TypeError on a document that is not a credential."""
    return ScramCredential(salt=base64.b64decode(data["salt"]), stored_key=base64.b64decode(data["stored_key"]),
                           server_key=base64.b64decode(data["server_key"]), iterations=int(data["iterations"]))


class SecurityStore:
    """The current credentials and bindings, and the changes to them. ``on_change()`` is called after every
    change this broker applies (its own or, in a cluster, another broker's)."""

    def __init__(self) -> None:
        self.credentials: dict[tuple[str, str], ScramCredential] = {}
        self.acls: frozenset[AclBinding] = frozenset()
        self.on_change: Callable[[], None] = lambda: None

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.credentials.get((user, mechanism))

    def users(self) -> dict[str, dict[str, int]]:
        """user -> {mechanism: iterations}."""
        result: dict[str, dict[str, int]] = {}
        for (user, mechanism), credential in self.credentials.items():
            result.setdefault(user, {})[mechanism] = credential.iterations
        return result

    async def alter_credentials(self, upserts: Iterable[tuple[str, str, ScramCredential]],
                                deletions: Iterable[tuple[str, str]]) -> None:
        raise NotImplementedError

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        raise NotImplementedError

    async def delete_acls(self, bindings: Iterable[AclBinding]) -> None:
        raise NotImplementedError

    async def add_if_absent(self, user: str, mechanism: str, credential: ScramCredential) -> bool:
        """Create a bootstrap credential unless the user has one for the mechanism. True when created."""
        raise NotImplementedError


class EmbeddedSecurityStore(SecurityStore):
    """Single node: ``security.json`` in the data dir (module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        self.path = Path(data_dir) / SECURITY_FILE
        self._lock: asyncio.Lock | None = None

    def load_blocking(self) -> None:
        """Read the file (absent: nothing stored yet). Blocking: at start-up.

        Raises:
            ValueError: the file exists but does not parse (never silently dropped: it holds credentials).
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            data = json.loads(raw)
            credentials = {(str(user), str(mechanism)): decode_credential(value)
                           for user, mechanisms in dict(data.get("scram", {})).items()
                           for mechanism, value in dict(mechanisms).items()}
            acls = frozenset(AclBinding.from_json(item) for item in data.get("acls", ()))
        except (ValueError, KeyError, TypeError, AclError) as exc:
            raise ValueError(f"{self.path} is corrupt: {exc}") from exc
        self.credentials, self.acls = credentials, acls

    def _document(self, credentials, acls) -> bytes:
        scram: dict[str, dict[str, dict]] = {}
        for (user, mechanism), credential in sorted(credentials.items()):
            scram.setdefault(user, {})[mechanism] = encode_credential(credential)
        return json.dumps({"version": 1, "scram": scram,
                           "acls": [b.to_json() for b in sorted(acls, key=lambda b: json.dumps(b.to_json()))]},
                          indent=1, sort_keys=True).encode()

    def _write(self, contents: bytes) -> None:
        """tmp + fsync + rename + directory fsync, created 0600 (the file holds ServerKeys, which let their
        holder pose as this broker to a client). Blocking: worker thread."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # a tmp left by a crash may have other bits
            view = memoryview(contents)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    async def _commit(self, credentials, acls) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await asyncio.to_thread(self._write, self._document(credentials, acls))
            self.credentials, self.acls = credentials, acls
        self.on_change()

    async def alter_credentials(self, upserts, deletions) -> None:
        credentials = dict(self.credentials)
        for user, mechanism in deletions:
            credentials.pop((user, mechanism), None)
        for user, mechanism, credential in upserts:
            credentials[(user, mechanism)] = credential
        await self._commit(credentials, self.acls)

    async def create_acls(self, bindings) -> None:
        await self._commit(self.credentials, self.acls | frozenset(bindings))

    async def delete_acls(self, bindings) -> None:
        await self._commit(self.credentials, self.acls - frozenset(bindings))

    async def add_if_absent(self, user, mechanism, credential) -> bool:
        if (user, mechanism) in self.credentials:
            return False
        await self.alter_credentials([(user, mechanism, credential)], [])
        return True


def acl_key_id(binding: AclBinding) -> str:
    return hashlib.sha256(json.dumps(binding.to_json(), sort_keys=True).encode()).hexdigest()


class EtcdSecurityStore(SecurityStore):
    """Cluster: keys in etcd next to the rest of the metadata (module docstring). ``metadata`` is the
    ``EtcdMetadata`` backend: its client writes, its watch feeds ``on_kvs``."""

    def __init__(self, metadata: Any) -> None:
        super().__init__()
        self.metadata = metadata
        self.revision = 0
        self._seen: dict[bytes, int] = {}
        self._waiters: list[tuple[int, asyncio.Future]] = []
        metadata.kv_listeners.append(self.on_kvs)

    def _prefixes(self) -> tuple[bytes, bytes]:
        prefix = self.metadata.layout.prefix
        return prefix + b"scram/", prefix + b"acls/"

    def _credential_key(self, user: str, mechanism: str) -> bytes:
        return self._prefixes()[0] + f"{urllib.parse.quote(user, safe='')}/{mechanism}".encode()

    def _acl_key(self, binding: AclBinding) -> bytes:
        return self._prefixes()[1] + acl_key_id(binding).encode()

    def on_kvs(self, kvs: dict, revision: int) -> None:
        """The metadata watch delivered a new view (every key under the cluster's prefix, as of
        ``revision``): take the security keys from it when they changed. Loop thread."""
        scram_prefix, acl_prefix = self._prefixes()
        seen = {key: kv.mod_revision for key, kv in kvs.items()
                if key.startswith(scram_prefix) or key.startswith(acl_prefix)}
        if seen != self._seen:
            credentials: dict[tuple[str, str], ScramCredential] = {}
            acls = set()
            for key in seen:
                kv = kvs[key]
                try:
                    if key.startswith(scram_prefix):
                        quoted, _, mechanism = key[len(scram_prefix):].decode().rpartition("/")
                        credentials[(urllib.parse.unquote(quoted), mechanism)] = decode_credential(json.loads(kv.value))
                    else:
                        acls.add(AclBinding.from_json(json.loads(kv.value)))
                except (ValueError, KeyError, TypeError, AclError, UnicodeDecodeError) as exc:
                    # One bad key must not stop a broker nor hide the others; it is named, its value is not.
                    log.error("ignoring the unreadable security key %s: %s", key.decode("utf-8", "replace"),
                              type(exc).__name__)
            self._seen = seen
            self.credentials, self.acls = credentials, frozenset(acls)
            self.on_change()
        self.revision = max(self.revision, revision)
        still = []
        for wanted, future in self._waiters:
            if self.revision >= wanted:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((wanted, future))
        self._waiters = still

    async def _apply(self, operations, compare=()) -> bool:
        """Write ``operations`` in transactions of at most ``MAX_TXN_OPS`` (etcd's --max-txn-ops default is
        128), then wait until this broker's view shows the last one. False when ``compare`` failed."""
        operations = list(operations)
        succeeded = True
        for start in range(0, len(operations), MAX_TXN_OPS):
            succeeded = await self._apply_one(operations[start:start + MAX_TXN_OPS], compare) and succeeded
        return succeeded

    async def _apply_one(self, operations, compare=()) -> bool:
        from copyless.broker.cluster import etcd_client as etcd

        try:
            result = await self.metadata.client.txn(list(compare), list(operations))
        except etcd.EtcdUnavailable as exc:
            raise StoreError(f"the metadata store did not answer ({exc}); the change may or may not have been "
                             f"made") from None
        self.metadata.stats["etcd_writes"] += 1
        if result.succeeded and self.revision < result.revision:
            future = asyncio.get_running_loop().create_future()
            self._waiters.append((result.revision, future))
            try:
                async with asyncio.timeout(PROPAGATION_TIMEOUT_S):
                    await future
            except TimeoutError:
                log.warning("a security change was written at revision %d but this broker has not seen it yet",
                            result.revision)
        return result.succeeded

    async def alter_credentials(self, upserts, deletions) -> None:
        from copyless.broker.cluster import etcd_client as etcd

        operations = [etcd.delete(self._credential_key(user, mechanism)) for user, mechanism in deletions]
        operations += [etcd.put(self._credential_key(user, mechanism),
                                json.dumps(encode_credential(credential), sort_keys=True).encode())
                       for user, mechanism, credential in upserts]
        if operations:
            await self._apply(operations)

    async def create_acls(self, bindings) -> None:
        from copyless.broker.cluster import etcd_client as etcd

        operations = [etcd.put(self._acl_key(b), json.dumps(b.to_json(), sort_keys=True).encode()) for b in bindings]
        if operations:
            await self._apply(operations)

    async def delete_acls(self, bindings) -> None:
        from copyless.broker.cluster import etcd_client as etcd

        operations = [etcd.delete(self._acl_key(b)) for b in bindings]
        if operations:
            await self._apply(operations)

    async def add_if_absent(self, user, mechanism, credential) -> bool:
        from copyless.broker.cluster import etcd_client as etcd

        key = self._credential_key(user, mechanism)
        return await self._apply([etcd.put(key, json.dumps(encode_credential(credential), sort_keys=True).encode())],
                                 compare=[etcd.created(key, 0)])
