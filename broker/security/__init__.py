"""Authentication and authorization: SASL sessions, ACLs, mTLS principals, TLS contexts and kTLS, the
credential and ACL store. The pure cores (``acl``, ``sasl``, ``principal``; SCRAM in
``protocol.scram``) know nothing of sockets; ``tls`` and ``store`` are the shell's."""
