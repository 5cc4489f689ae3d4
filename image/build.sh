#!/bin/sh
# `make image`: builds scheduler:<version> and scheduler:latest from the Containerfile.
#
# Environment (the Makefile passes its variables of the same names):
#   IMAGE         image name (scheduler)
#   BASE_IMAGE    base of both stages (python:3.11-slim). Used if present locally or pullable;
#                 otherwise DEBIAN_BASE is built from Debian's packages (image/build-base.sh) and used.
#   DEBIAN_BASE   name of that self-built base (localhost/scheduler-base:bookworm-2)
#   PODMAN        podman command with its global flags (podman --runtime runc)
#   BUILD_FLAGS   flags for `podman build` (host network, explicit ulimits)
#   CA_BUNDLE     CA bundle handed to pip in the build stage as a secret (the host's, if present)
set -eu
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-scheduler}
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}
DEBIAN_BASE=${DEBIAN_BASE:-localhost/scheduler-base:bookworm-2}
PODMAN=${PODMAN:-podman --runtime runc}
BUILD_FLAGS=${BUILD_FLAGS:---network host --ulimit nofile=16384:16384 --ulimit nproc=4096:4096}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then revision="$revision-dirty"; fi
source=${SOURCE:-$(git config --get remote.origin.url 2>/dev/null || true)}
created=$(date -u -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)" +%Y-%m-%dT%H:%M:%SZ)

base=$BASE_IMAGE
if ! $PODMAN image exists "$base"; then
	if $PODMAN pull --quiet "$base" >/dev/null 2>&1; then
		:
	else
		echo "base image $base: not local and not pullable; using $DEBIAN_BASE from Debian's packages"
		base=$DEBIAN_BASE
		$PODMAN image exists "$base" || PODMAN="$PODMAN" sh image/build-base.sh "$base"
	fi
fi

secret=
if [ -s "$CA_BUNDLE" ]; then secret="--secret id=cacert,src=$CA_BUNDLE"; fi

# shellcheck disable=SC2086  # the flag lists are word-split on purpose
$PODMAN build $BUILD_FLAGS $secret \
	--file Containerfile \
	--build-arg BASE_IMAGE="$base" \
	--build-arg VERSION="$version" \
	--build-arg REVISION="$revision" \
	--build-arg SOURCE="$source" \
	--build-arg CREATED="$created" \
	--tag "$IMAGE:$version" --tag "$IMAGE:latest" \
	.
$PODMAN image ls --filter "reference=$IMAGE" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
