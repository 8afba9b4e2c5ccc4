#!/usr/bin/env bash
# Build every local image that sandboxes/docker/from_images.txt maps FROM images to (no registry is
# reachable; Debian and PyPI are, at build time). Idempotent: images already present are kept.
#   trsi/base:bookworm, trsi/base:trixie, trsi/base:bullseye  (debootstrap, build_base_image.sh)
#   trsi/debian:<suite>: the same, trusting this machine's extra CAs (/usr/local/share/ca-certificates)
#   trsi/python:3.11 (bookworm's python3), trsi/python:3.13 (trixie's python3)
#   trsi/uv:0.8.15 (PyPI's uv binaries, for COPY --from=ghcr.io/astral-sh/uv:...)
# Usage: build_images.sh [--force]
set -euo pipefail
cd "$(dirname "$0")"
FORCE="${1:-}"
# Base images made before build_base_image.sh set the rootfs to 755 have a / that only root may enter
# (a task's service users could not run anything): rebuild those and every image built on them.
for suite in bookworm trixie bullseye; do
  if docker image inspect "trsi/base:$suite" >/dev/null 2>&1 &&
      [ "$(docker run --rm --network none "trsi/base:$suite" stat -c %a /)" != 755 ]; then
    echo "build_images: trsi/base:$suite has a / only root may enter: rebuilding every image"; FORCE=--force
  fi
done
have() { [ "$FORCE" != "--force" ] && docker image inspect "$1" >/dev/null 2>&1; }
for suite in bookworm trixie bullseye; do
  TRSI_SUITE=$suite ./build_base_image.sh $FORCE
done
build() {  # tag, dockerfile, build args...
  local tag=$1 file=$2; shift 2
  if have "$tag"; then echo "build_images: $tag already present"; return; fi
  echo "build_images: building $tag"
  docker build -t "$tag" -f "$file" "$@" . >"$CTX/build.log" 2>&1 || {
    tail -30 "$CTX/build.log" >&2; echo "build_images: building $tag failed" >&2; exit 1; }
  echo "build_images: built $tag"
}
CTX=$(mktemp -d /tmp/trsi-images.XXXXXX)
trap 'rm -rf "$CTX"' EXIT
cp ./*.Dockerfile "$CTX"/
mkdir "$CTX/certs"
cp /usr/local/share/ca-certificates/*.crt "$CTX/certs/" 2>/dev/null || true
cd "$CTX"
# Transitional packages trixie dropped that bookworm-based images (python:3.X-slim-bookworm) install.
TRIXIE_COMPAT="libgl1-mesa-glx:libgl1,libglx-mesa0"
build trsi/debian:bookworm trust.Dockerfile --build-arg BASE=trsi/base:bookworm
build trsi/debian:trixie trust.Dockerfile --build-arg BASE=trsi/base:trixie --build-arg COMPAT="$TRIXIE_COMPAT"
build trsi/debian:bullseye trust.Dockerfile --build-arg BASE=trsi/base:bullseye
build trsi/python:3.11 python.Dockerfile --build-arg BASE=trsi/debian:bookworm
build trsi/python:3.13 python.Dockerfile --build-arg BASE=trsi/debian:trixie
build trsi/uv:0.8.15 uv.Dockerfile --build-arg UV_VERSION=0.8.15
