#!/usr/bin/env bash
# Makes what `cluster/up.sh --secure` runs the cluster with, in DIR (made once; later runs reuse it, so the
# credentials of a cluster whose volumes survive stay valid):
#
#   ca.pem, broker.pem          a private CA, and one broker certificate (CN=broker) whose names cover every
#                               broker as peers and the host reach it: brokerN, brokerN-internal, localhost,
#                               127.0.0.1 (cluster/make-certs.sh)
#   broker.toml                 cluster/broker.toml plus the security settings: INTERNAL and EXTERNAL both
#                               SASL_SSL with SCRAM-SHA-512, brokers authenticating to each other as User:broker,
#                               the ACL authorizer with super.users User:broker and User:admin, and the two
#                               users created at first start (add.scram, so no password is on a command line)
#   admin.properties            for clients on the host (kcat -F, copyless -F, cluster/demo.sh --secure):
#                               SASL_SSL, SCRAM-SHA-512, user admin, this CA
#
# Passwords are 24 random bytes, base64; every file but the CA certificate is 0600.
#
#   cluster/make-secure.sh DIR
set -euo pipefail
if [ $# -ne 1 ]; then sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
HERE=$(cd "$(dirname "$0")" && pwd)
dir=$1
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/broker.pem" ]; then
    "$HERE/make-certs.sh" "$dir" \
        "broker:broker1,broker2,broker3,broker1-internal,broker2-internal,broker3-internal,localhost,IP:127.0.0.1"
fi
password() { openssl rand -base64 24 | tr -d '/+=\n'; }
if [ ! -s "$dir/passwords" ]; then
    printf 'broker=%s\nadmin=%s\n' "$(password)" "$(password)" >"$dir/passwords"
fi
broker_password=$(sed -n 's/^broker=//p' "$dir/passwords")
admin_password=$(sed -n 's/^admin=//p' "$dir/passwords")
jaas="org.apache.kafka.common.security.scram.ScramLoginModule required username=\\\"broker\\\" password=\\\"$broker_password\\\";"
{
    cat "$HERE/broker.toml"
    cat <<TOML

# Security (cluster/make-secure.sh): every listener SASL_SSL with SCRAM-SHA-512, inter-broker included.
"listener.security.protocol.map" = "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL"
"sasl.enabled.mechanisms" = "SCRAM-SHA-512"
"sasl.mechanism.inter.broker.protocol" = "SCRAM-SHA-512"
"listener.name.internal.scram-sha-512.sasl.jaas.config" = "$jaas"
"ssl.keystore.location" = "/etc/copyless/secure/broker.pem"
"ssl.truststore.location" = "/etc/copyless/secure/ca.pem"
"authorizer.class.name" = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"super.users" = "User:broker;User:admin"
"add.scram" = ["SCRAM-SHA-512=[name=broker,password=$broker_password]", "SCRAM-SHA-512=[name=admin,password=$admin_password]"]
TOML
} >"$dir/broker.toml"
cat >"$dir/admin.properties" <<PROPERTIES
security.protocol=SASL_SSL
sasl.mechanisms=SCRAM-SHA-512
sasl.username=admin
sasl.password=$admin_password
ssl.ca.location=$(cd "$dir" && pwd)/ca.pem
PROPERTIES
# The brokers run as root in their containers, but the mount must be readable whoever runs docker.
chmod 0644 "$dir/ca.pem"
chmod 0755 "$dir"
