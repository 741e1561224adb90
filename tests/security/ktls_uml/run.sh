#!/usr/bin/env bash
# The kTLS path, end to end, on a kernel that has the tls module: boots a User-Mode Linux kernel (Debian's
# user-mode-linux package) whose root is this machine's / (hostfs), loads its tls and AES-GCM modules, and
# runs check.py inside: a broker with an SSL listener, 20,000 records of 1 KB produced and fetched over
# TLS 1.2 by copyless's client, the bytes compared, and the broker's counters (every fetched record byte
# sent by sendfile on a kTLS session, none copied).
#
#   tests/security/ktls_uml/run.sh OPENSSL_LIB_DIR [WORK_DIR]
#
# OPENSSL_LIB_DIR holds a libssl.so.3/libcrypto.so.3 built with enable-ktls (Debian's OpenSSL 3.0 is built
# without it: `openssl s_server -help` lists no -ktls), e.g. `apt-get source openssl` then
# `./Configure linux-x86_64 enable-ktls shared no-tests && make -j2 build_libs` in its folder; Python's ssl
# loads it through LD_LIBRARY_PATH. Needs: apt-get install user-mode-linux kmod. Not part of the suite (it
# needs both). Prints check.py's output; exit status 0 only when it passed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
openssl_lib=$(cd "${1:?OPENSSL_LIB_DIR}" && pwd)
work=${2:-$(mktemp -d -t ktls-uml.XXXXXX)}
mkdir -p "$work/tmp"
"$repo/cluster/make-certs.sh" "$work/certs" "broker:IP:127.0.0.1"
modules=$(ls -d /usr/lib/uml/modules/* | head -1)
cat >"$work/init.sh" <<INIT
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp "$work/tmp"
ip link set lo up
for m in crypto/gf128mul crypto/ghash-generic crypto/ctr crypto/gcm crypto/seqiv crypto/cryptd net/tls/tls; do
    insmod "$modules/kernel/\$m.ko"
done >"$work/insmod.log" 2>&1
cd "$repo" && LD_LIBRARY_PATH="$openssl_lib" timeout 900 "$repo/.venv/bin/python" "$here/check.py" "$work" >"$work/out" 2>&1
echo "exit \$?" >>"$work/out"
sync
poweroff -f
INIT
chmod +x "$work/init.sh"
TMPDIR=/dev/shm timeout 1200 linux mem=1500M rootfstype=hostfs rootflags=/ rw init="$work/init.sh" con=null \
    con0=fd:0,fd:1 >"$work/console.log" 2>&1 </dev/null || true
cat "$work/out"
grep -qx "exit 0" "$work/out"
