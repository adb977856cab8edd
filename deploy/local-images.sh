#!/usr/bin/env bash
# Build kvrelay's images on a machine that reaches Debian's and PyPI's mirrors but no image
# registry: a Debian base made by debootstrap, Redis from Debian's package, the CPU worker
# and the gateway. Starts a Docker daemon first if none answers (and installs docker.io,
# docker-compose and debootstrap with apt when they are missing). Run as root:
#
#   deploy/local-images.sh          then: deploy/smoke.sh
#
# Variables: SUITE (bookworm), MIRROR, SECURITY_MIRROR, CA_BUNDLE (the bundle pip trusts
# inside the builds, passed as a build secret), TORCH_WHEEL (a local torch CPU wheel for
# the worker: /opt/wheels/torch-*+cpu-*.whl if present, else the CPU index is used).
set -euo pipefail
cd "$(dirname "$0")/.."

SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}
BASE_IMAGE=${BASE_IMAGE:-kvrelay-base:$SUITE}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
TORCH_WHEEL=${TORCH_WHEEL:-$(find /opt/wheels -maxdepth 1 -name "torch-*+cpu-*.whl" 2>/dev/null | sort -V | tail -n 1 || true)}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/kvrelay-dockerd.log}

phase() {  # phase NAME COMMAND...: run it, then say how long it took
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    "$@"
    echo "== $name: $((SECONDS - start)) s"
}

ensure_tools() {
    if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null \
            || ! command -v docker-compose >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose debootstrap
    fi
    if ! docker info >/dev/null 2>&1; then
        nohup dockerd >"$DOCKERD_LOG" 2>&1 &
        echo "$!" >/run/kvrelay-dockerd.pid
        for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
        docker info >/dev/null 2>&1 || { echo "dockerd did not start: $DOCKERD_LOG" >&2; exit 1; }
        echo "dockerd started (pid $(cat /run/kvrelay-dockerd.pid), log $DOCKERD_LOG)"
    fi
}

# `docker build` with BuildKit (the Dockerfiles mount build secrets): buildx where it is
# installed, else a client older than 23 (Debian's docker.io) with DOCKER_BUILDKIT=1.
build() {
    if docker buildx version >/dev/null 2>&1; then
        docker buildx build --load "$@"
        return
    fi
    local client major
    for client in docker /usr/bin/docker; do
        major=$("$client" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
        if [ -n "$major" ] && [ "$major" -lt 23 ]; then
            DOCKER_BUILDKIT=1 "$client" build "$@"
            return
        fi
    done
    echo "no docker client here builds with BuildKit: install docker-buildx" >&2
    return 1
}

base_image() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "$BASE_IMAGE exists"
        return
    fi
    local rootfs
    rootfs=$(mktemp -d)
    debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >/dev/null
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
        "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" "$SECURITY_MIRROR" "$SUITE" \
        >"$rootfs/etc/apt/sources.list"
    # As Debian's own images do: later installs leave out manuals, docs and translations,
    # and apt keeps neither the packages it downloaded nor its binary caches in a layer.
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' >"$rootfs/etc/dpkg/dpkg.cfg.d/slim"
    printf '%s\n' 'APT::Keep-Downloaded-Packages "false";' 'Dir::Cache::pkgcache "";' \
        'Dir::Cache::srcpkgcache "";' 'Acquire::Languages "none";' \
        >"$rootfs/etc/apt/apt.conf.d/90kvrelay-slim"
    chroot "$rootfs" apt-get clean
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE"
    rm -rf "$rootfs"
}

redis_image() {
    build --build-arg BASE_IMAGE="$BASE_IMAGE" -t "kvrelay-redis:$SUITE" deploy/redis
}

worker_cpu_image() {
    local torch=(--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu)
    rm -rf deploy/wheels
    if [ -n "$TORCH_WHEEL" ]; then
        # The local CPU wheel, by its exact version (2.13.0+cpu): no index has it, so pip
        # can only take this file, never a download of the CUDA build.
        mkdir -p deploy/wheels
        cp "$TORCH_WHEEL" deploy/wheels/
        local version
        version=$(basename "$TORCH_WHEEL" | cut -d- -f2)
        torch=(--build-arg "TORCH_VERSION=$version"
               --build-arg TORCH_INDEX_URL=https://pypi.org/simple)
    fi
    build -f worker/Dockerfile --target cpu --build-arg BASE_IMAGE="$BASE_IMAGE" "${torch[@]}" \
        --secret id=ca,src="$CA_BUNDLE" -t kvrelay-worker:cpu .
    rm -rf deploy/wheels
    docker run --rm --entrypoint python kvrelay-worker:cpu -c \
        'import torch; assert torch.version.cuda is None, torch.__version__; print("torch", torch.__version__)'
}

gateway_image() {
    build -f deploy/gateway/Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --secret id=ca,src="$CA_BUNDLE" -t kvrelay-gateway:latest .
}

phase "docker and tools" ensure_tools
phase "base image ($BASE_IMAGE, debootstrap)" base_image
phase "redis image" redis_image
phase "worker image (cpu)" worker_cpu_image
phase "gateway image" gateway_image
docker images --format 'table {{.Repository}}:{{.Tag}}\t{{.Size}}' | grep -E 'REPOSITORY|kvrelay'
