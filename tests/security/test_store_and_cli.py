"""Where credentials and ACLs live on a single node (``security.json``: written whole, 0600, refused when
corrupt, kept across kill -9), and ``copyless users`` / ``copyless acls`` with a kcat-style properties file."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from copyless.broker.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from copyless.broker.security.store import EmbeddedSecurityStore
from copyless.client.admin_security import Acl
from copyless.protocol.scram import credential_from_password
from tests.security.conftest import ALICE_PASSWORD, start_secure
from tests.support.security import ADMIN_PASSWORD, produce, unique

pytestmark = pytest.mark.timeout(300)


def test_embedded_store_round_trip_and_corruption(tmp_path):
    store = EmbeddedSecurityStore(tmp_path)
    changes = []
    store.on_change = lambda: changes.append(1)
    credential = credential_from_password("SCRAM-SHA-512", "pw", b"0123456789abcdef", 4096)
    binding = AclBinding(ResourceType.TOPIC, "t", PatternType.PREFIXED, "User:a", "*", Operation.READ,
                         Permission.ALLOW).check()

    async def change():
        await store.alter_credentials([("a,b/c", "SCRAM-SHA-512", credential)], [])
        await store.create_acls([binding])
        await store.create_acls([binding])  # creating it twice stores it once

    asyncio.run(change())
    assert len(changes) == 3
    assert (tmp_path / "security.json").stat().st_mode & 0o777 == 0o600
    document = json.loads((tmp_path / "security.json").read_text())
    assert set(document["scram"]["a,b/c"]["SCRAM-SHA-512"]) == {"salt", "iterations", "stored_key", "server_key"}
    reopened = EmbeddedSecurityStore(tmp_path)
    reopened.load_blocking()
    assert reopened.credential("a,b/c", "SCRAM-SHA-512") == credential
    assert reopened.acls == frozenset({binding})
    (tmp_path / "security.json").write_text('{"version": 1, "scram": {"x": {"SCRAM-SHA-512": {"salt": 1}}}}')
    with pytest.raises(ValueError, match="corrupt"):
        EmbeddedSecurityStore(tmp_path).load_blocking()


def test_credentials_and_acls_survive_kill_9(tmp_path, certs):
    setup = start_secure(tmp_path / "b", certs)
    try:
        topic = unique("durable")
        setup.admin_call("create_topics", [topic])
        setup.admin_call("set_scram_credential", "erin", "erin-pw", mechanism="SCRAM-SHA-256")
        setup.grant(Acl("TOPIC", topic, "LITERAL", "User:erin", "*", "WRITE", "ALLOW"))
        erin = setup.sasl("erin", "erin-pw", mechanism="SCRAM-SHA-256")
        assert produce("confluent-kafka", setup.bootstrap("SASL_SSL"), erin, topic, [b"before"]) == 0
        setup.broker.kill()
        setup.broker.start()
        from tests.support.security import listener_ports

        setup.ports = listener_ports(setup.broker)
        assert produce("confluent-kafka", setup.bootstrap("SASL_SSL"), erin, topic, [b"after"]) == 0
        # --add-scram at the restart did not reset a password changed since.
        setup.admin_call("set_scram_credential", "alice", "changed-pw")
        setup.broker.stop()
        setup.broker.start()
        setup.ports = listener_ports(setup.broker)
        old = setup.sasl("alice", ALICE_PASSWORD)
        assert produce("copyless", setup.bootstrap("SASL_SSL"), old, topic, [b"x"]) == 58
    finally:
        if setup.broker.alive():
            setup.broker.stop()


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "copyless.broker", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_users_and_acls_commands_with_a_properties_file(secure, tmp_path):
    admin_properties = tmp_path / "admin.properties"
    admin_properties.write_text(f"security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\nsasl.username=admin\n"
                                f"sasl.password={ADMIN_PASSWORD}\nssl.ca.location={secure.certs / 'ca.pem'}\n")
    os.chmod(admin_properties, 0o600)
    bootstrap = ["-b", secure.bootstrap("SASL_SSL"), "-F", str(admin_properties)]
    result = _cli("users", "set", "frank", *bootstrap, "--mechanism", "SCRAM-SHA-256", "--iterations", "8192",
                  stdin="frank-pw\n")
    assert result.returncode == 0, result.stderr
    listed = json.loads(_cli("users", "list", *bootstrap, "--json").stdout)
    assert listed["users"]["frank"] == {"SCRAM-SHA-256": 8192}

    topic = unique("cli-acl")
    secure.admin_call("create_topics", [topic])
    result = _cli("acls", "--bootstrap-server", secure.bootstrap("SASL_SSL"), "--command-config", str(admin_properties),
                  "--add", "--allow-principal", "User:frank", "--operation", "Write", "--operation", "Describe",
                  "--topic", topic)
    assert result.returncode == 0, result.stderr
    assert "operation=WRITE" in result.stdout
    frank = tmp_path / "frank.properties"
    frank.write_text(f"security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-256\nsasl.username=frank\n"
                     f"sasl.password=frank-pw\nssl.ca.location={secure.certs / 'ca.pem'}\n")
    result = _cli("produce", topic, "-b", secure.bootstrap("SASL_SSL"), "-F", str(frank), "--acks", "1",
                  stdin="a\nb\n")
    assert result.returncode == 0, result.stderr
    listing = _cli("acls", "--list", "--topic", topic, *bootstrap, "--json")
    assert {a["operation"] for a in json.loads(listing.stdout)["current"]} == {"WRITE", "DESCRIBE"}
    refused = _cli("acls", "--remove", "--topic", topic, *bootstrap, stdin="")
    assert refused.returncode == 1 and "--force" in refused.stderr
    removed = _cli("acls", "--remove", "--force", "--topic", topic, *bootstrap, "--json")
    assert len(json.loads(removed.stdout)["removed"]) == 2
    result = _cli("produce", topic, "-b", secure.bootstrap("SASL_SSL"), "-F", str(frank), "--acks", "1", stdin="c\n")
    assert result.returncode == 1 and "TOPIC_AUTHORIZATION_FAILED" in result.stderr
    # -X over the file, and a non-admin asking for the user list is refused.
    denied = _cli("users", "list", "-b", secure.bootstrap("SASL_SSL"), "-F", str(frank))
    assert denied.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in denied.stderr
    wrong = _cli("users", "list", *bootstrap, "-X", "sasl.password=wrong")
    assert wrong.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in wrong.stderr
    assert "wrong" not in wrong.stderr.split(":")[0]
    deleted = _cli("users", "delete", "frank", *bootstrap, "--mechanism", "SCRAM-SHA-256")
    assert deleted.returncode == 0, deleted.stderr
    again = _cli("users", "delete", "frank", *bootstrap, "--mechanism", "SCRAM-SHA-256")
    assert again.returncode == 1 and "RESOURCE_NOT_FOUND" in again.stderr
