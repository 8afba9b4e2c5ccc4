#!/usr/bin/env bash
# System set-up shared by `make demo`, `make test` and `.ci/run`: installs the Debian packages the
# sandboxes need and, for the test suite, starts dockerd and builds the local images.
# Usage: scripts/setup_system.sh demo|test
#   demo: bubblewrap + tmux (the local sandbox backend), git + sqlite3 (tools the built-in tasks use),
#         and tcmalloc (optional: faster CPU runs).
#   test: everything the whole suite needs: the above, docker.io + debootstrap, a running dockerd,
#         and the local base image trsi/base:bookworm.
# As root it installs what is missing; otherwise it stops at once with the exact command to run.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-test}"
case "$mode" in demo|test) ;; *) echo "usage: $0 demo|test" >&2; exit 2;; esac

# command:package pairs.
pairs=(bwrap:bubblewrap tmux:tmux git:git sqlite3:sqlite3 slirp4netns:slirp4netns mkfs.ext4:e2fsprogs)
[ "$mode" = test ] && pairs+=(dockerd:docker.io debootstrap:debootstrap mkfs.btrfs:btrfs-progs mkfs.ext4:e2fsprogs)

need=()
for pair in "${pairs[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
root=0; [ "$(id -u)" = 0 ] && root=1
# Optional: tcmalloc, which the Makefile preloads into CPU runs (XLA's large temporaries are then reused,
# not faulted in again on every call; benchmarks/bench_allocator.py). Installed as root, else a hint.
if [ -z "$(scripts/tcmalloc_path.sh)" ]; then
  if [ $root = 1 ]; then need+=(libtcmalloc-minimal4)
  else echo "setup: optional, for faster CPU runs: sudo apt-get install -y libtcmalloc-minimal4" >&2; fi
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ $root = 0 ]; then
    echo "setup: missing system packages: ${need[*]}" >&2
    echo "setup: run this once, then repeat the make command:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/tmp/trsi-apt.log 2>&1 || {
    tail -20 /tmp/trsi-apt.log >&2; echo "setup: apt-get install failed (log /tmp/trsi-apt.log)" >&2; exit 1; }
fi
[ "$mode" = demo ] && exit 0

# A running Docker engine and the local images for the docker-backend tests.
if ! docker info >/dev/null 2>&1; then
  if [ $root = 0 ]; then
    echo "setup: the Docker engine is not running; start it (as root) and repeat:" >&2
    echo "    sudo sh -c 'setsid dockerd >/tmp/dockerd.log 2>&1 &'" >&2
    exit 1
  fi
  # Its data root is a btrfs file system (a sparse loop image) so that `--storage-opt size` gives each
  # task container a disk quota (overlay2 on ext4 cannot enforce one).
  data=/var/lib/trsi-docker
  if ! mountpoint -q "$data"; then
    [ -f "$data.img" ] || { truncate -s 64G "$data.img" && mkfs.btrfs -q "$data.img"; }
    mkdir -p "$data" && mount -o loop "$data.img" "$data"
  fi
  btrfs quota enable "$data"
  echo "setup: starting dockerd (btrfs data root $data)"
  (setsid dockerd --data-root "$data" --storage-driver btrfs >/tmp/dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "setup: dockerd did not start"; tail -20 /tmp/dockerd.log; exit 1; } >&2
fi
sandboxes/docker/build_images.sh  # trsi/base, trsi/debian, trsi/python, trsi/uv (from_images.txt targets)
