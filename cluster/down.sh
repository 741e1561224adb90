#!/usr/bin/env bash
# Stops and removes the copyless cluster's containers and network (SIGTERM first: brokers shut down cleanly).
#
#   cluster/down.sh [--single] [--volumes]
#
# --volumes also deletes the named volumes: every broker's log and etcd's data. Without it the next
# cluster/up.sh finds the data where it was. --single acts on docker-compose.single.yml.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

SINGLE=()
DOWN=(down --remove-orphans)
for arg in "$@"; do
    case "$arg" in
        --single) SINGLE=(--single) ;;
        --volumes | -v) DOWN+=(--volumes) ;;
        -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "down: unknown argument $arg" >&2; exit 2 ;;
    esac
done
# With the opt-in profile named, `down` also stops its services (Prometheus) when they run.
export COMPOSE_PROFILES=${COMPOSE_PROFILES:-metrics}
exec "$HERE/compose.sh" "${SINGLE[@]}" "${DOWN[@]}"
