#!/usr/bin/env bash
# Makes a private CA and PEM certificates signed by it, with the openssl command line (no other tool).
#
#   cluster/make-certs.sh DIR NAME[:SAN,SAN...] ...
#
# DIR/ca.pem and DIR/ca.key: the CA (made once; reused when present, so certificates made later still
# chain to it). For each NAME: DIR/NAME.pem (the private key and the certificate: what the broker's
# ssl.keystore.location reads), DIR/NAME-cert.pem and DIR/NAME-key.pem (the same two apart: what clients'
# ssl.certificate.location / ssl.key.location read). The certificate's subject reads CN=NAME,OU=copyless in
# RFC 2253 form (what ssl.principal.mapping.rules match against), and its subject alternative names are DNS:NAME plus the SANs given (DNS:host or IP:address; a bare value is
# a DNS name), so it serves as a broker's and as a client's (mTLS) certificate. Keys are EC P-256, valid
# 825 days; the private keys are written 0600.
set -euo pipefail
if [ $# -lt 2 ]; then sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; fi
dir=$1; shift
mkdir -p "$dir"
umask 077
if [ ! -s "$dir/ca.pem" ] || [ ! -s "$dir/ca.key" ]; then
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -days 825 \
        -subj "/CN=copyless test CA/O=copyless" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
fi
for spec in "$@"; do
    name=${spec%%:*}
    sans="DNS:$name"
    if [ "$spec" != "$name" ]; then
        IFS=',' read -r -a extra <<<"${spec#*:}"
        for san in "${extra[@]}"; do
            case "$san" in
                DNS:* | IP:*) sans="$sans,$san" ;;
                *) sans="$sans,DNS:$san" ;;
            esac
        done
    fi
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 \
        -subj "/OU=copyless/CN=$name" -keyout "$dir/$name-key.pem" -out "$dir/$name.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n' "$sans" \
        >"$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -sha256 \
        -days 825 -extfile "$dir/$name.ext" -out "$dir/$name-cert.pem" 2>/dev/null
    cat "$dir/$name-key.pem" "$dir/$name-cert.pem" >"$dir/$name.pem"
    rm -f "$dir/$name.csr" "$dir/$name.ext"
done
chmod 0644 "$dir"/*-cert.pem "$dir/ca.pem"
