"""Security settings by Kafka's names: per-listener overrides, the protocol map, validation that names the
setting but never a sensitive value, JAAS lines, --add-scram specs, TLS contexts from real PEM files, and
the client's properties files."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from copyless.broker.config import BrokerConfig, ConfigError, load_toml
from copyless.broker.security.manager import parse_add_scram
from copyless.broker.security.settings import SecuritySettings, SettingsError, parse_jaas, parse_protocol_map
from copyless.broker.security.tls import client_context, iana_to_openssl, kernel_tls_available, server_context
from copyless.client.security import ClientSecurity, read_properties
from tests.support.security import make_certs


def test_listener_overrides_and_protocol_map():
    settings = SecuritySettings.from_mapping({
        "listener.security.protocol.map": "CLIENTS:SASL_SSL,INTERNAL:SSL",
        "ssl.client.auth": "none",
        "listener.name.internal.ssl.client.auth": "required",
        "listener.name.clients.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.internal.scram-sha-512.sasl.jaas.config":
            'org.apache.kafka.common.security.scram.ScramLoginModule required username="b" password="p";',
    })
    clients, internal = settings.listener("CLIENTS"), settings.listener("INTERNAL")
    assert (clients.protocol, internal.protocol) == ("SASL_SSL", "SSL")
    assert clients.get("ssl.client.auth") == "none" and internal.get("ssl.client.auth") == "required"
    assert clients.mechanisms == ("SCRAM-SHA-512",)
    assert settings.listener("PLAINTEXT").protocol == "PLAINTEXT"
    assert parse_jaas(internal.get("scram-sha-512.sasl.jaas.config")) == {"username": "b", "password": "p"}


def test_validation_names_the_setting_not_the_secret(tmp_path):
    path = tmp_path / "b.toml"
    path.write_text('listeners = "SASL_SSL://127.0.0.1:0"\n"ssl.keystore.location" = "/x.pem"\n'
                    '"sasl.jaas.config" = "nonsense with password=hunter2"\n')
    with pytest.raises(ConfigError) as info:
        load_toml(path)
    assert "sasl.jaas.config" in str(info.value) and "hunter2" not in str(info.value)
    path.write_text('listeners = "SASL_SSL://127.0.0.1:0"\n')
    with pytest.raises(ConfigError, match="ssl.keystore.location"):
        load_toml(path)
    # Without a map, a listener of any name is plaintext, as before the map existed; a set map must name it.
    path.write_text('listeners = "A://127.0.0.1:0"\n')
    assert load_toml(path).security.listener("A").protocol == "PLAINTEXT"
    path.write_text('listeners = "A://127.0.0.1:0"\n"listener.security.protocol.map" = "B:SSL"\n')
    with pytest.raises(ConfigError, match="listener.security.protocol.map"):
        load_toml(path)
    path.write_text('"ssl.client.auth" = "sometimes"\n')
    with pytest.raises(ConfigError, match="ssl.client.auth"):
        load_toml(path)
    path.write_text('"listener.name.x.authorizer.class.name" = "acl"\n')  # not a per-listener setting
    with pytest.raises(ConfigError, match="unknown"):
        load_toml(path)
    path.write_text('listeners = "SASL_PLAINTEXT://127.0.0.1:0"\n"sasl.enabled.mechanisms" = "GSSAPI"\n')
    with pytest.raises(ConfigError, match="sasl.enabled.mechanisms"):
        load_toml(path)
    with pytest.raises(SettingsError):
        parse_protocol_map("A:TLS")


def test_describe_masks_sensitive_values():
    settings = SecuritySettings.from_mapping({"ssl.key.password": "k3y", "super.users": "User:a",
                                              "listener.name.x.plain.sasl.jaas.config": "...password=p4ss"},
                                             add_scram=("SCRAM-SHA-512=[name=a,password=z]",))
    shown = str(settings.describe())
    assert "User:a" in shown and "k3y" not in shown and "p4ss" not in shown and "password=z" not in shown


def test_add_scram_specs():
    assert parse_add_scram("SCRAM-SHA-512=[name=admin,password=a-b]") == \
        {"mechanism": "SCRAM-SHA-512", "name": "admin", "password": "a-b"}
    with pytest.raises(SettingsError):
        parse_add_scram("SCRAM-SHA-512=[name=admin,password=a,b]")  # a comma needs quotes
    spec = parse_add_scram('SCRAM-SHA-256=[name=alice,iterations=8192,salt="c2FsdA==",saltedpassword="eHl6"]')
    assert spec == {"mechanism": "SCRAM-SHA-256", "name": "alice", "iterations": "8192", "salt": "c2FsdA==",
                    "saltedpassword": "eHl6"}
    assert parse_add_scram('scram-sha-512=[name=a,password="p,w]"]')["password"] == "p,w]"
    with pytest.raises(SettingsError) as info:
        parse_add_scram("SCRAM-SHA-1=[name=a,password=secret99]")
    assert "secret99" not in str(info.value)
    with pytest.raises(SettingsError):
        parse_add_scram("SCRAM-SHA-512=[password=x]")


def test_tls_contexts_from_pem_files(tmp_path):
    certs = make_certs(tmp_path, "broker:IP:127.0.0.1", "client")
    settings = SecuritySettings.from_mapping({"ssl.keystore.location": str(certs / "broker.pem"),
                                              "ssl.truststore.location": str(certs / "ca.pem"),
                                              "ssl.client.auth": "requested",
                                              "ssl.enabled.protocols": "TLSv1.2",
                                              "ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"})
    listener = settings.listener("SSL")
    server = server_context(listener)
    assert server.verify_mode == ssl.CERT_OPTIONAL and server.maximum_version == ssl.TLSVersion.TLSv1_2
    assert [c["name"] for c in server.get_ciphers() if c["protocol"] == "TLSv1.2"] == ["ECDHE-ECDSA-AES128-GCM-SHA256"]
    assert client_context(listener).check_hostname
    # kTLS asked for: the context caps at TLS 1.2 (no KeyUpdate) and carries OpenSSL's KTLS option.
    assert server_context(listener, ktls=True).options & 0x8
    bad = SecuritySettings.from_mapping({"ssl.keystore.location": str(certs / "nope.pem")}).listener("SSL")
    with pytest.raises(SettingsError, match="ssl.keystore.location"):
        server_context(bad)
    partial = SecuritySettings.from_mapping({"ssl.keystore.location": str(certs / "broker.pem"),
                                             "ssl.cipher.suites": "TLS_AES_128_GCM_SHA256"}).listener("SSL")
    with pytest.raises(SettingsError, match="TLS 1.3"):
        server_context(partial)


def test_iana_names():
    assert iana_to_openssl("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384") == "ECDHE-RSA-AES256-GCM-SHA384"
    assert iana_to_openssl("TLS_RSA_WITH_AES_128_GCM_SHA256") == "AES128-GCM-SHA256"
    assert iana_to_openssl("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256") == "ECDHE-ECDSA-CHACHA20-POLY1305"
    assert iana_to_openssl("ECDHE-RSA-AES128-GCM-SHA256") == "ECDHE-RSA-AES128-GCM-SHA256"


def test_kernel_tls_detection_matches_the_kernel():
    """The start-up probe agrees with what the kernel lists (tcp_available_ulp shows loaded ULPs; the probe
    also loads an available module, so it may find one the list does not show yet, never the reverse)."""
    status = kernel_tls_available()
    try:
        listed = "tls" in Path("/proc/sys/net/ipv4/tcp_available_ulp").read_text().split()
    except OSError:
        listed = None
    if listed:
        assert status.available
    if not status.available:
        assert status.reason and not listed


def test_client_properties_files(tmp_path):
    certs = make_certs(tmp_path / "c", "broker")
    path = tmp_path / "client.properties"
    path.write_text("# kcat -F style\nsecurity.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-256\n"
                    f"sasl.username=alice\nsasl.password=pw=with=equals\nssl.ca.location={certs / 'ca.pem'}\n")
    security = ClientSecurity.from_properties(read_properties(path))
    assert (security.protocol, security.mechanism, security.username, security.password) == \
        ("SASL_SSL", "SCRAM-SHA-256", "alice", "pw=with=equals")
    assert security.ssl_context is not None and "pw=with" not in repr(security)
    java = ClientSecurity.from_properties({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u" '
                            'password="p";'})
    assert (java.mechanism, java.username, java.password) == ("PLAIN", "u", "p")
    with pytest.raises(ValueError):
        ClientSecurity.from_properties({"security.protocol": "SASL_SSL", "sasl.mechanisms": "GSSAPI"})


def test_default_broker_config_has_no_security():
    config = BrokerConfig()
    config.validate()
    assert config.security.listener("PLAINTEXT").protocol == "PLAINTEXT"
    assert not config.security.authorizer_enabled
