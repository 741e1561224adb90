#!/usr/bin/env bash
# Runs docker compose on one of the two compose files, under a fixed project name, with whichever compose is
# installed: `docker compose` (v2) when the docker CLI has it, else `docker-compose` (1.29, Debian's).
#
#   cluster/compose.sh [--single | --secure] ARGS...   e.g. cluster/compose.sh ps, cluster/compose.sh logs -f broker1
#
# --secure layers docker-compose.secure.yml over the cluster's file, with the project's credentials and
# certificates in cluster/.secure/<project> (cluster/make-secure.sh).
#
# The cluster (docker-compose.yml) is project "copyless", the single broker (docker-compose.single.yml) project
# "copyless-single", so the two never take each other's containers for orphans. COMPOSE_PROJECT_NAME
# overrides either; COPYLESS_COMPOSE names the compose command ("docker compose" or "docker-compose").
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)

FILE=$REPO_ROOT/docker-compose.yml
PROJECT=${COMPOSE_PROJECT_NAME:-copyless}
EXTRA=()
if [ "${1:-}" = "--single" ]; then
    shift
    FILE=$REPO_ROOT/docker-compose.single.yml
    PROJECT=${COMPOSE_PROJECT_NAME:-copyless-single}
elif [ "${1:-}" = "--secure" ]; then
    shift
    EXTRA=(--file "$REPO_ROOT/docker-compose.secure.yml")
    export COPYLESS_SECURE_DIR=${COPYLESS_SECURE_DIR:-$REPO_ROOT/cluster/.secure/$PROJECT}
fi

if [ -n "${COPYLESS_COMPOSE:-}" ]; then
    read -r -a COMPOSE <<<"$COPYLESS_COMPOSE"
elif docker compose version >/dev/null 2>&1; then
    COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    COMPOSE=(docker-compose)
else
    echo "compose: neither 'docker compose' nor 'docker-compose' is installed" \
        "(Debian: apt-get install docker-compose)" >&2
    exit 1
fi
exec "${COMPOSE[@]}" --project-name "$PROJECT" --file "$FILE" "${EXTRA[@]}" --project-directory "$REPO_ROOT" "$@"
