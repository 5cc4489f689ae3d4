#!/bin/sh
# Builds a minimal Debian base image with Python 3 from Debian's packages (no image registry
# needed): mmdebstrap writes a root filesystem as a tarball, `podman import` turns it into an
# image. Used by `make image` when BASE_IMAGE is not in local storage and cannot be pulled.
#
#   image/build-base.sh IMAGE_NAME [SUITE] [MIRROR]
#
# The image holds python3 with venv (ensurepip) and the CA certificates; the wheels bundle their
# native libraries (librdkafka, libpq, OpenSSL), so nothing else is needed. No apt, no docs.
set -eu

name=${1:?usage: build-base.sh IMAGE_NAME [SUITE] [MIRROR]}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}
podman=${PODMAN:-podman}

command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 1; }

# Same inputs, same tarball: file times from SOURCE_DATE_EPOCH (mmdebstrap honours it).
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
export SOURCE_DATE_EPOCH

# libstdc++6: grpcio's wheel links it (python:3.11-slim has it). A change here renames the base's
# tag (DEBIAN_BASE in the Makefile), so that a machine holding the older base builds the new one.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mmdebstrap --quiet --mode=root --variant=essential --format=tar \
	--include=python3,python3-venv,ca-certificates,libstdc++6 \
	--dpkgopt='path-exclude=/usr/share/man/*' \
	--dpkgopt='path-exclude=/usr/share/doc/*' \
	--dpkgopt='path-include=/usr/share/doc/*/copyright' \
	--dpkgopt='path-exclude=/usr/share/info/*' \
	--dpkgopt='path-exclude=/usr/share/locale/*' \
	--customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
	"$suite" "$tmp/rootfs.tar" "$mirror"

$podman import --quiet \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV LANG=C.UTF-8' \
	--change 'CMD ["python3"]' \
	--message "Debian $suite with python3 (mmdebstrap)" \
	"$tmp/rootfs.tar" "$name" >/dev/null
echo "built base image $name from Debian $suite"
