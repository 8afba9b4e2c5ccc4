"""The local backend's stand-in for `apt-get`/`apt` while it replays a Dockerfile's RUN steps.

A local sandbox runs on the host's read-only /usr without network, so nothing can be installed. The
stand-in makes `apt-get install` succeed when the host already has every named package, and fail with
the missing names and the remedy (`--backend=docker`) otherwise; `update`/`clean` are no-ops.
`host_installed` is what the verifier's apt-get shim accepts on this backend.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess

from trsi_jax.sandbox import toolchain

BUILD_DIR = "/.trsi-build"  # sandbox path of the stand-in during the build; removed before the agent starts

SCRIPT = r"""#!/bin/sh
# trsi local backend: apt-get/apt stand-in (the host's /usr is read-only and there is no network).
cmd=""; pkgs=""; skip=0
for a in "$@"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  case "$a" in
    -o|-t|-c) skip=1 ;;
    -*) ;;
    *) if [ -z "$cmd" ]; then cmd=$a; else pkgs="$pkgs $a"; fi ;;
  esac
done
case "$cmd" in
  update|clean|autoclean|autoremove|check) exit 0 ;;
  install)
    missing=""
    for p in $pkgs; do
      name=${p%%=*}; name=${name%:*}
      grep -qxF "$name" BUILD_DIR/host-packages || missing="$missing $name"
    done
    if [ -n "$missing" ]; then
      echo "local backend: apt-get install cannot install packages (the host's /usr is read-only, no network);" \
           "not on the host:$missing. Install them on the host or use --backend=docker." >&2
      exit 100
    fi
    echo "local backend: apt-get install: already on the host:$pkgs"; exit 0 ;;
  *)
    echo "local backend: apt-get $cmd is not possible (the host's /usr is read-only); use --backend=docker." >&2
    exit 100 ;;
esac
""".replace("BUILD_DIR", BUILD_DIR)


@functools.cache
def host_packages() -> str:
    """Newline-separated names of the Debian packages installed on the host (empty without dpkg)."""
    if shutil.which("dpkg-query") is None:
        return ""
    out = subprocess.run(toolchain.DPKG_INSTALLED, capture_output=True, text=True, check=False).stdout
    return "".join(name + "\n" for name in toolchain.dpkg_installed(out))


@functools.cache
def host_installed(path: str) -> str:
    """The host's packages and the commands in `path`'s directories (the host's, read-only in a local
    sandbox), space-separated: toolchain.INSTALLED_ENV for the local verifier."""
    names = set(host_packages().split())
    for d in path.split(":"):
        try:
            names.update(os.listdir(d))
        except OSError:
            continue
    return " ".join(sorted(names))
