#!/usr/bin/env bash
# Build a local Docker base image trsi/base:<suite> (no registry needed; default suite bookworm):
# debootstrap a minimal Debian rootfs with python3, pytest, tmux, git, sqlite3, coreutils and
# procps, then `docker import` it. Idempotent: exits at once if the image exists.
# Usage: build_base_image.sh [--force]
#   env TRSI_SUITE (bookworm | trixie | bullseye ...), TRSI_BASE_IMAGE, TRSI_DEBIAN_MIRROR override defaults
set -euo pipefail
SUITE="${TRSI_SUITE:-bookworm}"
IMAGE="${TRSI_BASE_IMAGE:-trsi/base:$SUITE}"
MIRROR="${TRSI_DEBIAN_MIRROR:-}"
PACKAGES="python3,python3-pytest,tmux,git,sqlite3,coreutils,procps,ca-certificates,less,file"

if [ "${1:-}" != "--force" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "build_base_image: $IMAGE already present"
  exit 0
fi
if [ -z "$MIRROR" ]; then
  # Use the machine's own apt mirror (deb822 or one-line sources), falling back to deb.debian.org.
  MIRROR=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list.d/*.sources \
      /etc/apt/sources.list 2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)
  MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi
command -v debootstrap >/dev/null || { echo "build_base_image: debootstrap missing (apt-get install debootstrap)" >&2; exit 1; }

ROOT=$(mktemp -d /tmp/trsi-rootfs.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
chmod 755 "$ROOT"  # the image's / (mktemp's 700 would let only root reach any file: su, nginx workers, sshd)
echo "build_base_image: debootstrap $SUITE from $MIRROR into $ROOT"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || {
  tail -30 "$ROOT.log" >&2; echo "build_base_image: debootstrap failed (log $ROOT.log)" >&2; exit 1; }
rm -f "$ROOT.log"
# Slim the image: apt caches and docs are not needed inside task containers.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/*
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "build_base_image: built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
