#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine with only Python 3.11, then runs it.
#   - a virtualenv in .venv with copyless and its [test] extra (real Kafka clients, hypothesis, pytest);
#   - as root, from Debian's packages: kcat (the librdkafka CLI the broker must serve) and etcd (the
#     cluster's metadata store; the cluster tests start their own etcd processes on loopback);
#   - as root, a deb-src entry for Debian's main archive (when none is configured) and the build dependencies
#     of librdkafka's source package, then librdkafka's own test runner, built once per source version into
#     ~/.cache/copyless (tests/librdkafka: about 3 minutes the first time, nothing after);
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
# librdkafka's test suite (tests/librdkafka): its source package needs a deb-src line, its build a C/C++
# toolchain and the codec headers. Idempotent: nothing is added or installed when it is there already.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    if ! apt-cache showsrc librdkafka 2>/dev/null | grep -q '^Version:'; then
        if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
            printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                "$suite" > /etc/apt/sources.list.d/copyless-deb-src.sources
        fi
        apt-get update -qq >/dev/null 2>&1 || true
    fi
    build_missing=()
    for package in $(.venv/bin/python -c 'from tests.librdkafka.build import BUILD_PACKAGES; print(*BUILD_PACKAGES)'); do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || build_missing+=("$package")
    done
    if [ ${#build_missing[@]} -gt 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${build_missing[@]}") >/dev/null \
            || echo "warning: could not install ${build_missing[*]}; librdkafka's suite will be skipped" >&2
    fi
fi
.venv/bin/python -m tests.librdkafka.build >/dev/null || echo "warning: librdkafka's test runner not built; its tests will be skipped" >&2
# Tests marked slow (the benchmark modules' end-to-end runs, librdkafka's longer tests, the second and third
# variants of some fault tests) keep the whole run under CI's 45 minutes on a 2-core machine; they run when a
# marker expression is given: ./tests/run.sh -m slow (only them) or ./tests/run.sh -m "slow or not slow".
for argument in "$@"; do
    case "$argument" in -m|-m*|--markexpr*) exec .venv/bin/python -m pytest "$@" ;; esac
done
exec .venv/bin/python -m pytest -m "not slow" "$@"
