#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine with only Python 3.11, then runs it.
#   - a virtualenv in .venv with copyless and its [test] extra (real Kafka clients, hypothesis, pytest);
#   - as root, from Debian's packages: kcat (the librdkafka CLI the broker must serve) and etcd (the
#     cluster's metadata store; the cluster tests start their own etcd processes on loopback);
#   - where a docker command is installed, also debootstrap (cluster/build-images.sh makes the images' base
#     from Debian's packages, no registry needed) and docker-compose when `docker compose` is absent, for
#     tests/docker; without a Docker engine those tests skip, saying so.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

# Debian packages: command -> package.
declare -A PACKAGES=([kcat]=kcat [etcd]=etcd-server [etcdctl]=etcd-client)
if command -v docker >/dev/null 2>&1; then
    PACKAGES[debootstrap]=debootstrap
    docker compose version >/dev/null 2>&1 || PACKAGES[docker-compose]=docker-compose
fi
missing=()
for command in "${!PACKAGES[@]}"; do
    # debootstrap lives in /usr/sbin, which a non-login root shell may not have on its PATH.
    PATH="$PATH:/usr/sbin:/sbin" command -v "$command" >/dev/null 2>&1 || missing+=("${PACKAGES[$command]}")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >/dev/null \
            || echo "warning: could not install ${missing[*]}; the tests that need them will be skipped" >&2
    else
        echo "warning: ${missing[*]} not installed and not root; the tests that need them will be skipped" >&2
    fi
fi
exec .venv/bin/python -m pytest "$@"
