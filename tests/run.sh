#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine with only Python 3.11, then runs it.
#   - a virtualenv in .venv with copyless and its [test] extra (real Kafka clients, hypothesis, pytest);
#   - kcat from Debian's packages (the librdkafka 2.0.2 CLI the broker must serve), when running as root.
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
if ! command -v kcat >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat) >/dev/null \
            || echo "warning: could not install kcat; its tests will be skipped" >&2
    else
        echo "warning: kcat not installed and not root; its tests will be skipped" >&2
    fi
fi
exec .venv/bin/python -m pytest "$@"
