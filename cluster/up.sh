#!/usr/bin/env bash
# Brings up the copyless cluster (three brokers, three etcd nodes) and waits until every container is healthy.
# Builds the images first when they are missing or out of date (cluster/build-images.sh: no registry needed).
#
#   cluster/up.sh [--single | --secure] [--metrics] [--timeout SECONDS]
#
# --secure runs every listener as SASL_SSL with SCRAM-SHA-512, brokers included, and the ACL authorizer:
# cluster/make-secure.sh makes a CA, the brokers' certificate and the admin and broker credentials in
# cluster/.secure/<project> (kept for the next up), and clients on the host use its admin.properties
# (kcat -F, copyless -F, cluster/demo.sh --secure).
# --single starts the one-broker docker-compose.single.yml instead. --metrics also builds the Prometheus image
# and starts the compose file's "metrics" profile: Prometheus scraping every broker, on 127.0.0.1:19090
# (COPYLESS_PROMETHEUS_PORT). Brokers answer on the host at 127.0.0.1:19092, 19093, 19094
# (COPYLESS_BROKER{1,2,3}_PORT), the single broker at 127.0.0.1:9092 (COPYLESS_PORT). Exits non-zero, with the failing containers' last log lines, if a container exits or is not
# healthy in time (default 120 s). cluster/down.sh stops it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

SINGLE=()
BUILD=()
TIMEOUT_S=120
# Services of a profile, left out unless it is asked for (`docker-compose config --services` 1.29 lists them).
OPTIONAL_SERVICES=(prometheus)
while [ $# -gt 0 ]; do
    case "$1" in
        --single) SINGLE=(--single) ;;
        --secure) SINGLE=(--secure) ;;
        --metrics) BUILD=(--prometheus); OPTIONAL_SERVICES=(); export COMPOSE_PROFILES=metrics ;;
        --timeout) TIMEOUT_S=$2; shift ;;
        -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "up: unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
compose() { "$HERE/compose.sh" "${SINGLE[@]}" "$@"; }

if [ "${SINGLE[*]}" = "--secure" ]; then
    SECURE_DIR=${COPYLESS_SECURE_DIR:-$HERE/.secure/${COMPOSE_PROJECT_NAME:-copyless}}
    "$HERE/make-secure.sh" "$SECURE_DIR"
fi
"$HERE/build-images.sh" "${BUILD[@]}" >/dev/null
# A failed `up` (an etcd node never healthy, say) is reported below with the containers' logs.
compose up --detach --remove-orphans || echo "up: compose up failed; looking at the containers" >&2

# `up` returns once the containers are started (and, through depends_on, once etcd is healthy); the brokers'
# own healthchecks are waited for here. A container that exited, is unhealthy or keeps restarting has failed.
STATE_FORMAT='{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} {{.RestartCount}}'
mapfile -t pending < <(compose config --services | grep -vxF -f <(printf '%s\n' "${OPTIONAL_SERVICES[@]}" ""))
deadline=$((SECONDS + TIMEOUT_S))
while [ ${#pending[@]} -gt 0 ]; do
    waiting=()
    failed=()
    for service in "${pending[@]}"; do
        id=$(compose ps -q "$service")
        state="missing none 0"
        [ -z "$id" ] || state=$(docker inspect --format "$STATE_FORMAT" "$id")
        read -r status health restarts <<<"$state"
        case "$status/$health" in
            running/healthy | running/none) ;;
            exited/* | dead/* | missing/* | */unhealthy) failed+=("$service") ;;
            *) if [ "$restarts" -ge 3 ]; then failed+=("$service"); else waiting+=("$service"); fi ;;
        esac
    done
    if [ ${#failed[@]} -gt 0 ] || { [ ${#waiting[@]} -gt 0 ] && [ $SECONDS -ge $deadline ]; }; then
        for service in "${failed[@]}" "${waiting[@]}"; do
            echo "up: $service is not healthy; its last log lines:" >&2
            compose logs --no-color --tail 20 "$service" >&2 || true
        done
        exit 1
    fi
    pending=("${waiting[@]}")
    [ ${#pending[@]} -eq 0 ] || sleep 1
done

if [ "${SINGLE[*]}" = "--single" ]; then
    echo "copyless is up: bootstrap 127.0.0.1:${COPYLESS_PORT:-9092}"
else
    printf 'copyless cluster is up: bootstrap 127.0.0.1:%s,127.0.0.1:%s,127.0.0.1:%s\n' \
        "${COPYLESS_BROKER1_PORT:-19092}" "${COPYLESS_BROKER2_PORT:-19093}" "${COPYLESS_BROKER3_PORT:-19094}"
    [ -z "${COMPOSE_PROFILES:-}" ] || echo "prometheus: http://127.0.0.1:${COPYLESS_PROMETHEUS_PORT:-19090}"
    [ -z "${SECURE_DIR:-}" ] || echo "SASL_SSL with SCRAM-SHA-512 everywhere; client settings: $SECURE_DIR/admin.properties"
fi
