"""Fixtures of the security tests: certificates (module scope) and a secured broker per module.

``secure_broker`` listens on four listeners: PLAINTEXT, SASL_PLAINTEXT, SASL_SSL (PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512) and SSL with client certificates required; the ACL authorizer is on with ``super.users``
``User:admin`` and nothing allowed without an ACL; ``admin`` and ``alice`` have SCRAM credentials from
``--add-scram``; the SSL listener maps ``CN=<name>,OU=copyless`` to ``User:<name>``. ``Secure`` bundles
the broker, its listener ports and ready-made identities.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker_process import TEST_BROKER_CONFIG, BrokerProcess
from tests.support.security import ADMIN_PASSWORD, Identity, listener_ports, make_certs

ALICE_PASSWORD = "alice-pw-7Hk"
# Low enough that a failed authentication's delay is measurable and the suite stays quick.
FAILED_AUTH_DELAY_MS = 400


@dataclass
class Secure:
    broker: BrokerProcess
    ports: dict[str, int]
    certs: Path

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"

    def sasl(self, user: str = "alice", password: str = ALICE_PASSWORD, mechanism: str = "SCRAM-SHA-512",
             protocol: str = "SASL_SSL") -> Identity:
        return Identity(protocol, ca=self.certs / "ca.pem" if protocol == "SASL_SSL" else None, username=user,
                        password=password, mechanism=mechanism)

    def mtls(self, name: str = "carol") -> Identity:
        return Identity("SSL", ca=self.certs / "ca.pem", cert=self.certs / f"{name}-cert.pem",
                        key=self.certs / f"{name}-key.pem")

    @property
    def admin(self) -> Identity:
        return self.sasl("admin", ADMIN_PASSWORD)

    def admin_call(self, method: str, *args, **kwargs):
        """Run ``Admin.<method>`` as the super user, over SASL_SSL."""
        from copyless import Admin

        async def go():
            async with Admin(self.bootstrap("SASL_SSL"), **self.admin.copyless()) as admin:
                return await getattr(admin, method)(*args, **kwargs)

        return asyncio.run(go())

    def grant(self, *acls) -> None:
        self.admin_call("create_acls", list(acls))


def secure_config(certs: Path, **overrides) -> dict:
    return {
        **TEST_BROKER_CONFIG,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "ssl.keystore.location": str(certs / "broker.pem"),
        "ssl.truststore.location": str(certs / "ca.pem"),
        "listener.name.ssl.ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+),OU=copyless$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin",
        "connection.failed.authentication.delay.ms": FAILED_AUTH_DELAY_MS,
        **overrides,
    }


SECURE_LISTENERS = ("--listener", "PLAINTEXT=127.0.0.1:0", "--listener", "SASL_PLAINTEXT=127.0.0.1:0",
                    "--listener", "SASL_SSL=127.0.0.1:0", "--listener", "SSL=127.0.0.1:0")
BOOTSTRAP_USERS = ("--add-scram", f"SCRAM-SHA-512=[name=admin,password={ADMIN_PASSWORD}]",
                   "--add-scram", f"SCRAM-SHA-512=[name=alice,password={ALICE_PASSWORD}]",
                   "--add-scram", f"SCRAM-SHA-256=[name=alice,password={ALICE_PASSWORD}]")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certs(tmp_path_factory.mktemp("certs"), "broker:localhost,IP:127.0.0.1", "carol", "dave", "mallory")


def start_secure(base: Path, certs: Path, *, config_overrides=None, extra_args=()) -> Secure:
    broker = BrokerProcess(data_dir=base / "data", log_path=base / "broker.log",
                           config=secure_config(certs, **(config_overrides or {})),
                           extra_args=(*SECURE_LISTENERS, *BOOTSTRAP_USERS, *extra_args))
    broker.start()
    return Secure(broker, listener_ports(broker), certs)


@pytest.fixture(scope="module")
def secure(tmp_path_factory, certs):
    setup = start_secure(tmp_path_factory.mktemp("secure"), certs)
    try:
        yield setup
    finally:
        if setup.broker.process is not None and setup.broker.process.poll() is None:
            code = setup.broker.stop()
            assert code == 0, f"broker exited with {code}:\n{setup.broker.log_tail()}"
