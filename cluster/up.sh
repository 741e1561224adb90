#!/usr/bin/env bash
# Brings up the copyless cluster (three brokers, three etcd nodes) and waits until every container is healthy.
# Builds the images first when they are missing or out of date (cluster/build-images.sh: no registry needed).
#
#   cluster/up.sh [--single] [--timeout SECONDS]
#
# --single starts the one-broker docker-compose.single.yml instead. Brokers answer on the host at
# 127.0.0.1:19092, 19093, 19094 (COPYLESS_BROKER{1,2,3}_PORT), the single broker at 127.0.0.1:9092
# (COPYLESS_PORT). Exits non-zero, with the failing containers' last log lines, if a container exits or is not
# healthy in time (default 120 s). cluster/down.sh stops it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

SINGLE=()
TIMEOUT_S=120
while [ $# -gt 0 ]; do
    case "$1" in
        --single) SINGLE=(--single) ;;
        --timeout) TIMEOUT_S=$2; shift ;;
        -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "up: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
compose() { "$HERE/compose.sh" "${SINGLE[@]}" "$@"; }

"$HERE/build-images.sh" >/dev/null
compose up --detach --remove-orphans

# `up` returns once the containers are started (and, through depends_on, once etcd is healthy); the brokers'
# own healthchecks are waited for here.
mapfile -t SERVICES < <(compose config --services)
deadline=$((SECONDS + TIMEOUT_S))
pending=("${SERVICES[@]}")
while [ ${#pending[@]} -gt 0 ]; do
    still=()
    failed=()
    for service in "${pending[@]}"; do
        id=$(compose ps -q "$service")
        state=$( [ -n "$id" ] && docker inspect --format '{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}} {{.RestartCount}}' "$id" || echo "missing - 0")
        read -r status health restarts <<<"$state"
        if [ "$status" = running ] && [ "$health" = healthy ]; then
            continue
        elif [ "$status" = exited ] || [ "$status" = dead ] || [ "$status" = missing ] \
            || [ "$health" = unhealthy ] || [ "${restarts:-0}" -ge 3 ]; then
            failed+=("$service")
        else
            still+=("$service")
        fi
    done
    if [ ${#failed[@]} -gt 0 ] || { [ ${#still[@]} -gt 0 ] && [ $SECONDS -ge $deadline ]; }; then
        for service in "${failed[@]}" "${still[@]}"; do
            echo "up: $service is not healthy; its last log lines:" >&2
            compose logs --no-color --tail 20 "$service" >&2 || true
        done
        exit 1
    fi
    pending=("${still[@]}")
    [ ${#pending[@]} -eq 0 ] || sleep 1
done

if [ ${#SINGLE[@]} -gt 0 ]; then
    echo "copyless is up: bootstrap 127.0.0.1:${COPYLESS_PORT:-9092}"
else
    echo "copyless cluster is up: bootstrap" \
        "127.0.0.1:${COPYLESS_BROKER1_PORT:-19092},127.0.0.1:${COPYLESS_BROKER2_PORT:-19093},127.0.0.1:${COPYLESS_BROKER3_PORT:-19094}"
fi
