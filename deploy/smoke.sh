#!/usr/bin/env bash
# The containers, for real (not part of `make test`; run deploy/local-images.sh first):
# compose's cpu profile starts Redis, two CPU worker replicas and the gateway; one streamed
# chat completion goes through the gateway with the `openai` package; the worker holding
# it gets SIGTERM mid-stream and the stream must finish on the other replica. Checks that
# the workers run their compiled CPU kernels (their ready lines say so), times each phase,
# and removes everything it started, volumes included.
#
# Variables: PYTHON (one with kvrelay and openai: .venv/bin/python), COMPOSE (docker
# compose or docker-compose, whichever is found), and compose's own KVRELAY_* ports.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
if [ -z "${COMPOSE:-}" ]; then
    if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi
export COMPOSE_PROJECT_NAME=kvrelay-smoke
export KVRELAY_REDIS_IMAGE=${KVRELAY_REDIS_IMAGE:-kvrelay-redis:bookworm}
export KVRELAY_REDIS_PORT=${KVRELAY_REDIS_PORT:-16379}
export KVRELAY_GATEWAY_PORT=${KVRELAY_GATEWAY_PORT:-18000}
export KVRELAY_WORKER_METRICS_PORT=${KVRELAY_WORKER_METRICS_PORT:-19400-19401}
# A job that has sent tokens gets 2 s to finish after SIGTERM, then is handed back.
export KVRELAY_SHUTDOWN_GRACE=2 KVRELAY_CONCURRENCY=4
# Two workers share this machine's cores: one torch thread each.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
KVRELAY_MODELS_DIR=$(mktemp -d)  # the workers' /models: empty, and nothing left in the repo
export KVRELAY_MODELS_DIR
SERVICES=(redis worker-cpu gateway)
compose() { $COMPOSE --profile cpu "$@"; }

phase() {  # phase NAME COMMAND...: run it, then say how long it took
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "== $name: $((SECONDS - start)) s"
}

teardown() {
    compose down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1 || true
    rm -rf "$KVRELAY_MODELS_DIR"
}
trap teardown EXIT

for image in kvrelay-worker:cpu kvrelay-gateway:latest "$KVRELAY_REDIS_IMAGE"; do
    docker image inspect "$image" >/dev/null 2>&1 \
        || { echo "no image $image: run deploy/local-images.sh first" >&2; exit 1; }
done

ready_lines() { compose logs --no-color worker-cpu 2>/dev/null | grep -E "kvrelay worker \S+ ready:" || true; }

wait_workers() {  # both replicas print their ready line
    for _ in $(seq 300); do
        [ "$(ready_lines | wc -l)" -ge 2 ] && return
        sleep 1
    done
    compose logs --no-color --tail 30 worker-cpu >&2
    echo "the workers did not get ready" >&2
    return 1
}

wait_gateway() {
    for _ in $(seq 60); do
        "$PYTHON" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$KVRELAY_GATEWAY_PORT/v1/models', timeout=2)" \
            2>/dev/null && return
        sleep 1
    done
    echo "the gateway did not answer" >&2
    return 1
}

phase "compose up (containers created)" compose up -d --no-build --scale worker-cpu=2 "${SERVICES[@]}"
phase "both workers ready" wait_workers
phase "gateway answering" wait_gateway
echo "-- the workers' ready lines:"
ready_lines | sed 's/^/   /'
if [ "$(ready_lines | grep -c 'integer dot (')" -ne 2 ]; then
    echo "a worker does not run the compiled CPU kernels" >&2
    exit 1
fi
phase "stream with a SIGTERM mid-way" \
    "$PYTHON" deploy/smoke_stream.py "http://127.0.0.1:$KVRELAY_GATEWAY_PORT/v1" \
    "redis://127.0.0.1:$KVRELAY_REDIS_PORT/0"
echo "-- the stopped worker's last lines:"
compose logs --no-color worker-cpu | grep -E "draining|stopped" | sed 's/^/   /' || true

check_takeover() {  # the job ended on the replica still running: both requests finished there
    local survivor finished
    survivor=$(compose ps -q worker-cpu | xargs docker inspect -f '{{.State.Running}} {{.Id}}' \
        | awk '$1 == "true" {print $2}')
    [ "$(echo "$survivor" | wc -w)" -eq 1 ] || { echo "expected one running worker" >&2; return 1; }
    finished=$(docker exec "$survivor" python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9400/metrics').read().decode())" \
        | awk '/^kvrelay_jobs_total\{outcome="finished"\}/ {print int($2)}')
    echo "-- the surviving worker finished ${finished:-0} jobs (the one taken over, then the second)"
    [ "${finished:-0}" -eq 2 ]
}
phase "takeover checked" check_takeover
phase "teardown" teardown
trap - EXIT
echo "smoke passed"
