"""TLS contexts from Kafka's settings, and kTLS: whether the kernel can take a session over. Synchronous
(reads certificate files at start-up); never imports asyncio.

Contexts:

- ``server_context(listener)``: ``ssl.keystore.location`` is a PEM file with the private key and the
  certificate chain (Kafka's PEM keystore type; JKS and PKCS12 are not read), ``ssl.key.password`` opens
  an encrypted key, ``ssl.truststore.location`` a PEM CA bundle; ``ssl.client.auth`` none/requested/required
  is CERT_NONE/OPTIONAL/REQUIRED; ``ssl.enabled.protocols`` and ``ssl.protocol`` bound the versions;
  ``ssl.cipher.suites`` takes TLS 1.2 suites by IANA name (``TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384``, as Java
  names them) or OpenSSL name. Python's ssl cannot narrow TLS 1.3 suites (it has no
  SSL_CTX_set_ciphersuites), so a list naming some TLS 1.3 suites but not all three is refused while TLS 1.3
  is enabled, rather than silently offering more than asked.
- ``client_context(...)``: the same files for a broker that connects to another (replication, forwarding),
  with the peer's host name checked when ``ssl.endpoint.identification.algorithm`` is ``https``.

Session tickets are off (``num_tickets = 0``): no resumption state to keep per client, and a TLS 1.3
server writes nothing after the handshake that the kernel would have to take over mid-stream.

kTLS (Linux >= 4.13 for TX; TLS 1.3 from 5.1): with OpenSSL 3's ``SSL_OP_ENABLE_KTLS`` (0x8; Python 3.11
has no named constant) on the context, OpenSSL hands the session's keys to the kernel after the handshake
when the kernel has the ``tls`` upper-layer protocol and the cipher is one it implements (AES-GCM). Then the
socket encrypts whatever is written to it, ``os.sendfile`` included, and the records go from the page cache
to the NIC without passing through Python. ``kernel_tls_available()`` asks the kernel once at start-up
(setting TCP_ULP "tls" on a connected loopback socket: ENOENT when the module is absent), and
``ktls_engaged(sock)`` asks per connection after the handshake (``getsockopt(SOL_TLS, TLS_TX)``), since
OpenSSL may still decline (a cipher the kernel lacks, an OpenSSL built without kTLS).

TLS 1.3 KeyUpdate under kTLS: the kernel keeps the TX key OpenSSL gave it. OpenSSL 3.0 cannot install a new
one, so a client's KeyUpdate asking the broker to update would leave the kernel on the old key. The broker
therefore offers at most TLS 1.2 on a kTLS session (``ssl.protocol`` is capped on the context when kTLS is
on), where there is no KeyUpdate; the copying path keeps TLS 1.3.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import struct
from dataclasses import dataclass

from copyless.broker.security.settings import ListenerSecurity, SettingsError

__all__ = ["server_context", "client_context", "kernel_tls_available", "ktls_engaged", "KtlsStatus",
           "OP_ENABLE_KTLS", "iana_to_openssl"]

log = logging.getLogger("copyless.tls")

OP_ENABLE_KTLS = getattr(ssl, "OP_ENABLE_KTLS", 0x8)
SOL_TLS = 282
TLS_TX = 1
TCP_ULP = getattr(socket, "TCP_ULP", 31)
_TLS13_SUITES = {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
_VERSIONS = {"TLSV1.2": ssl.TLSVersion.TLSv1_2, "TLSV1.3": ssl.TLSVersion.TLSv1_3}


@dataclass(frozen=True)
class KtlsStatus:
    """What start-up found: ``available`` when the kernel has the tls ULP, and why not otherwise."""

    available: bool
    reason: str

    def describe(self) -> str:
        return "kTLS sendfile" if self.available else f"copying ({self.reason})"


def kernel_tls_available() -> KtlsStatus:
    """Does the kernel offer the ``tls`` upper-layer protocol? One loopback connection, at start-up."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    client = accepted = None
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        client = socket.create_connection(listener.getsockname(), timeout=2)
        accepted, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        return KtlsStatus(True, "the kernel has the tls module")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return KtlsStatus(False, "the kernel has no tls module")
        if exc.errno == errno.ENOPROTOOPT:
            return KtlsStatus(False, "the kernel predates TCP_ULP")
        return KtlsStatus(False, f"TCP_ULP tls refused: {exc.strerror}")
    finally:
        for sock in (client, accepted, listener):
            if sock is not None:
                sock.close()


# struct tls_crypto_info: version (u16), cipher_type (u16). The kernel answers getsockopt(SOL_TLS, TLS_TX)
# with exactly this header when asked for exactly its size (any other length but the full crypto_info of
# the cipher in use is EINVAL), and EBUSY while no TX keys are installed.
_TLS_CRYPTO_INFO = struct.Struct("=HH")


def ktls_engaged(sock: socket.socket) -> bool:
    """Whether the kernel encrypts this socket's writes (OpenSSL installed TX keys after the handshake)."""
    try:
        _version, cipher_type = _TLS_CRYPTO_INFO.unpack(sock.getsockopt(SOL_TLS, TLS_TX, _TLS_CRYPTO_INFO.size))
    except (OSError, struct.error):
        return False
    return cipher_type != 0


def iana_to_openssl(name: str) -> str:
    """``TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384`` -> ``ECDHE-RSA-AES256-GCM-SHA384``; OpenSSL names pass."""
    if not name.startswith("TLS_") or "_WITH_" not in name:
        return name
    exchange, _, cipher = name[4:].partition("_WITH_")
    exchange = "" if exchange == "RSA" else exchange.replace("_", "-") + "-"
    cipher = (cipher.replace("AES_128", "AES128").replace("AES_256", "AES256")
              .replace("CHACHA20_POLY1305_SHA256", "CHACHA20-POLY1305").replace("_", "-"))
    return exchange + cipher


def _versions(listener: ListenerSecurity, *, cap_tls12: bool) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    enabled = sorted({_VERSIONS[item.strip().upper()] for item in str(listener.get("ssl.enabled.protocols")).split(",")
                      if item.strip()})
    newest = min(enabled[-1], _VERSIONS[str(listener.get("ssl.protocol")).upper()])
    if cap_tls12 and ssl.TLSVersion.TLSv1_2 in enabled:
        newest = ssl.TLSVersion.TLSv1_2
    return enabled[0], newest


def _apply_common(context: ssl.SSLContext, listener: ListenerSecurity, *, cap_tls12: bool) -> None:
    context.minimum_version, context.maximum_version = _versions(listener, cap_tls12=cap_tls12)
    suites = [s.strip() for s in str(listener.get("ssl.cipher.suites") or "").split(",") if s.strip()]
    if suites:
        tls13 = {s for s in suites if s in _TLS13_SUITES}
        if tls13 and tls13 != _TLS13_SUITES and context.maximum_version >= ssl.TLSVersion.TLSv1_3:
            raise SettingsError(f"listener {listener.name}: ssl.cipher.suites cannot narrow the TLS 1.3 suites here "
                                f"(name all of {', '.join(sorted(_TLS13_SUITES))}, or disable TLSv1.3)")
        tls12 = [iana_to_openssl(s) for s in suites if s not in _TLS13_SUITES]
        if tls12:
            try:
                context.set_ciphers(":".join(tls12))
            except ssl.SSLError:
                raise SettingsError(f"listener {listener.name}: no cipher of ssl.cipher.suites is available "
                                    f"({', '.join(suites)})") from None


def _key_password(listener: ListenerSecurity):
    return listener.get("ssl.key.password") or listener.get("ssl.keystore.password") or None


def server_context(listener: ListenerSecurity, *, ktls: bool = False) -> ssl.SSLContext:
    """The listener's server-side context. Raises SettingsError (a file that cannot be read, a key that does
    not open, suites that do not exist), naming the setting and never a password."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    keystore = listener.get("ssl.keystore.location")
    try:
        context.load_cert_chain(keystore, password=_key_password(listener))
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"listener {listener.name}: cannot load ssl.keystore.location {keystore} "
                            f"(a PEM file with the private key and the certificate chain): "
                            f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}") from None
    truststore = listener.get("ssl.truststore.location")
    if truststore:
        try:
            context.load_verify_locations(cafile=truststore)
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(f"listener {listener.name}: cannot load ssl.truststore.location {truststore}: "
                                f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}") from None
    context.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                           "required": ssl.CERT_REQUIRED}[str(listener.get("ssl.client.auth")).lower()]
    _apply_common(context, listener, cap_tls12=ktls)
    context.num_tickets = 0
    if ktls:
        context.options |= OP_ENABLE_KTLS
    return context


def client_context(listener: ListenerSecurity, *, check_hostname: bool | None = None) -> ssl.SSLContext:
    """The context a broker connects to its peers with on ``listener``: it trusts the truststore, presents
    the keystore (for peers that require client certificates), and checks host names per
    ``ssl.endpoint.identification.algorithm``. Raises SettingsError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    truststore = listener.get("ssl.truststore.location")
    try:
        if truststore:
            context.load_verify_locations(cafile=truststore)
        else:
            context.load_default_certs()
        if listener.get("ssl.keystore.location"):
            context.load_cert_chain(listener.get("ssl.keystore.location"), password=_key_password(listener))
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"listener {listener.name}: cannot load the TLS files for connecting to peers: "
                            f"{getattr(exc, 'strerror', None) or exc.__class__.__name__}") from None
    if check_hostname is None:
        check_hostname = str(listener.get("ssl.endpoint.identification.algorithm")).lower() == "https"
    context.check_hostname = check_hostname
    _apply_common(context, listener, cap_tls12=False)
    return context
