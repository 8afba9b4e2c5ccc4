"""The host directory that is a local sandbox's `/`, and every host-side operation on it.

Writable state lives here (workdir, /tmp, /root, a private minimal /etc, ...); the host's system
directories are bound over it read-only at run time (see `system_binds`). Host-side writes (Dockerfile
COPY, placing tests) walk the path component by component and never follow a symlink the agent may
have planted, so nothing lands outside the root.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from trsi_jax.sandbox import dockerfile as dfile
from trsi_jax.sandbox.base import SandboxError

SYSTEM_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
SPECIAL_ENTRIES = ("dev", "proc")
# The minimal /etc: small entries are copied (private and writable per sandbox), big directories of
# links (alternatives, certificates) are bound read-only from the host, which is much cheaper.
ETC_COPY = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
            "timezone", "bash.bashrc", "profile", "inputrc", "login.defs", "skel", "python3", "python3.11",
            "mime.types", "protocols", "services", "debian_version", "os-release", "shells")
ETC_BIND = ("alternatives", "terminfo")
ETC_NETWORK_COPY = ("resolv.conf", "ca-certificates.conf", "gai.conf")
ETC_NETWORK_BIND = ("ssl", "ca-certificates")


def system_binds(root: Path | None) -> list[str]:
    """bwrap args giving the host's system dirs (read-only) and links; with `root` (a bound root
    directory) the links are (re)made there on the host, since bwrap refuses existing ones."""
    args = []
    for name in SYSTEM_ENTRIES:
        host = Path("/") / name
        if host.is_symlink():
            target = os.readlink(host)
            if root is None:
                args += ["--symlink", target, f"/{name}"]
            elif not ((root / name).is_symlink() and os.readlink(root / name) == target):
                remove(root / name)
                (root / name).symlink_to(target)
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args


def remove(p: Path) -> None:
    """Remove a file, symlink or directory tree without following symlinks."""
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    elif p.exists():
        p.unlink()


class RootFS:
    """A sandbox root directory: skeleton, private /etc, and path-safe host-side file operations."""

    def __init__(self, root: Path, allow_internet: bool):
        self.root = root
        self.etc_binds: list[str] = []  # bwrap args binding the big /etc directories read-only
        root.mkdir()
        for d, mode in (("tmp", 0o1777), ("root", 0o700), ("home", 0o755), ("run", 0o755), ("var/tmp", 0o1777),
                        ("etc", 0o755), ("logs", 0o755)):
            (root / d).mkdir(parents=True, exist_ok=True)
            os.chmod(root / d, mode)
        for name in ETC_COPY + (ETC_NETWORK_COPY if allow_internet else ()):
            src = Path("/etc") / name
            if src.is_symlink() or src.is_file():
                shutil.copy2(src, root / "etc" / name, follow_symlinks=not src.is_symlink())
            elif src.is_dir():
                shutil.copytree(src, root / "etc" / name, symlinks=True)
        for name in ETC_BIND + (ETC_NETWORK_BIND if allow_internet else ()):
            if Path("/etc", name).is_dir():
                self.etc_binds += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
                (root / "etc" / name).mkdir()  # mount point, also for read-only (probe) roots
        (root / "etc" / "hostname").write_text("sandbox\n")

    def copy_in(self, context: Path, sources: tuple[str, ...], dest: str, cwd: str, where: str) -> None:
        """Dockerfile COPY/ADD of context `sources` to `dest` (relative to `cwd`); `where` names the line."""
        dest_abs = dest if dest.startswith("/") else f"{cwd.rstrip('/')}/{dest}"
        into_dir = dest.endswith("/") or len(sources) > 1
        for src in sources:
            matches = dfile.match_sources(context, src)
            if not matches:
                raise SandboxError(f"{where}: COPY source {src!r} not found in {context} (tests/ and solution "
                                   "files are never part of the environment)")
            for rel in matches:
                host_src = context / rel
                if host_src.is_dir():  # a directory's contents are copied, as docker does
                    target = self.host_dir(dest_abs, create=True)
                    for child in host_src.iterdir():
                        if not dfile.is_private(rel / child.name, context):
                            self._copy_entry(child, target / child.name)
                else:
                    name = dest_abs.rstrip("/") + "/" + rel.name if (into_dir or self.is_dir(dest_abs)) else dest_abs
                    parent, _, base = name.rpartition("/")
                    self._copy_entry(host_src, self.host_dir(parent or "/", create=True) / base)

    @staticmethod
    def _copy_entry(src: Path, dst: Path) -> None:
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        else:
            if dst.is_symlink() or dst.exists():
                remove(dst)
            shutil.copy2(src, dst, follow_symlinks=False)

    def is_dir(self, sandbox_path: str) -> bool:
        try:
            return self.host_dir(sandbox_path, create=False).is_dir()
        except SandboxError:
            return False

    def host_dir(self, sandbox_path: str, create: bool) -> Path:
        """Host path of a sandbox directory, each component a real directory under the root (symlinks
        and files in the way are replaced when `create`; only used while no agent process runs)."""
        parts = [p for p in sandbox_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise SandboxError(f"path {sandbox_path!r} must not contain '..'")
        if parts and parts[0] in SYSTEM_ENTRIES + SPECIAL_ENTRIES:
            raise SandboxError(f"the local backend cannot write into /{parts[0]} (read-only host system "
                               f"directory): {sandbox_path}; use the docker backend for such environments")
        cur = self.root
        for p in parts:
            cur = cur / p
            if cur.is_dir() and not cur.is_symlink():
                continue
            if not create:
                raise SandboxError(f"{sandbox_path}: not a directory in the sandbox")
            if cur.is_symlink() or cur.exists():
                remove(cur)
            cur.mkdir()
        return cur

    def replace_dir(self, host_dir: Path | None, sandbox_path: str) -> None:
        """Make `sandbox_path` a fresh directory holding a copy of host_dir (empty if None)."""
        target = self.host_dir(sandbox_path, create=True)
        remove(target)
        if host_dir is None:
            target.mkdir()
        else:
            shutil.copytree(host_dir, target, symlinks=False)

    def read_file(self, sandbox_path: str, max_bytes: int = 1 << 20) -> bytes | None:
        parent, _, name = sandbox_path.rstrip("/").rpartition("/")
        try:
            d = self.host_dir(parent or "/", create=False)
            fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW)
        except (SandboxError, OSError):
            return None
        with os.fdopen(fd, "rb") as f:
            if not os.path.isfile(f"/proc/self/fd/{fd}"):
                return None
            return f.read(max_bytes)
