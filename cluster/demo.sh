#!/usr/bin/env bash
# Runs the failover demo (cluster/demo.py) against the cluster cluster/up.sh started: an RF-3 topic, an
# idempotent acks=all producer and a consumer group, the leader of partition 0 killed with `docker kill`, a
# timeline of the failover, and a verdict on every acknowledged record. Exits 0 only on that verdict.
#
#   cluster/demo.sh [--project NAME] [--bootstrap HOST:PORT,...] [--interval-ms N] [--json] [--secure | -F FILE]
#
# --secure: against cluster/up.sh --secure, with its cluster/.secure/<project>/admin.properties.
#
# Runs on the host with the checkout's virtualenv (.venv, as the README makes it), or the Python in $PYTHON;
# either must have copyless installed. Ports follow COPYLESS_BROKER{1,2,3}_PORT like cluster/up.sh.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$REPO_ROOT/.venv/bin/python}
if ! "$PY" -c 'import copyless' >/dev/null 2>&1; then
    echo "demo: $PY cannot import copyless; make the virtualenv first:" \
        "python3.11 -m venv .venv && .venv/bin/pip install -q -e ." >&2
    exit 2
fi
exec "$PY" "$REPO_ROOT/cluster/demo.py" "$@"
