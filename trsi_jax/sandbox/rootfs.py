"""The host directory that is a local sandbox's `/`, and every host-side operation on it.

Writable state lives here (workdir, /tmp, /root, a private minimal /etc, ...); the host's system
directories are bound over it read-only at run time (see `system_binds`). Every host-side access
(Dockerfile COPY, placing tests, reading results, the terminal's prompt counter) resolves the path
openat-style: one component at a time from a descriptor of the root, with O_NOFOLLOW, so a symlink the
agent planted, or swapped in mid-walk, never leads the host outside the root.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from trsi_jax.sandbox import dockerfile as dfile
from trsi_jax.sandbox.base import SandboxError
from trsi_jax.sandbox.netns import DNS

SYSTEM_ENTRIES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
SPECIAL_ENTRIES = ("dev", "proc")
# The minimal /etc: small entries are copied (private and writable per sandbox), big directories of
# links (alternatives, certificates) are bound read-only from the host, which is much cheaper.
ETC_COPY = ("passwd", "group", "hosts", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
            "timezone", "bash.bashrc", "profile", "inputrc", "login.defs", "skel", "python3", "python3.11",
            "mime.types", "protocols", "services", "debian_version", "os-release", "shells")
ETC_BIND = ("alternatives", "terminfo")
ETC_NETWORK_COPY = ("ca-certificates.conf", "gai.conf")
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
        root.mkdir(exist_ok=True)  # may be a mounted disk already (see disk.py)
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
        if allow_internet:  # slirp4netns's DNS forwarder (see netns.py), not the host's resolver
            (root / "etc" / "resolv.conf").write_text(f"nameserver {DNS}\n")

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
        """Copy src to dst (no agent process runs): a directory is merged entry by entry, replacing
        whatever non-directory (e.g. a planted symlink) stands where a directory goes."""
        if src.is_dir() and not src.is_symlink():
            if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
                remove(dst)
            dst.mkdir(exist_ok=True)
            shutil.copystat(src, dst)
            for child in src.iterdir():
                RootFS._copy_entry(child, dst / child.name)
        else:
            if dst.is_symlink() or dst.exists():
                remove(dst)
            shutil.copy2(src, dst, follow_symlinks=False)

    def is_dir(self, sandbox_path: str) -> bool:
        try:
            with self.dir_fd(sandbox_path, create=False):
                return True
        except SandboxError:
            return False

    @staticmethod
    def _parts(sandbox_path: str) -> list[str]:
        parts = [p for p in sandbox_path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise SandboxError(f"path {sandbox_path!r} must not contain '..'")
        return parts

    @contextlib.contextmanager
    def dir_fd(self, sandbox_path: str, create: bool):
        """A descriptor of sandbox directory `sandbox_path`, walked from the root one component at a time
        without following symlinks; with `create`, whatever non-directory is in the way is replaced."""
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise SandboxError(f"sandbox root {self.root} vanished ({e.strerror})") from None
        try:
            for p in self._parts(sandbox_path):
                try:
                    nxt = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as e:
                    if not create or e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise SandboxError(f"{sandbox_path}: not a directory in the sandbox") from None
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(p, dir_fd=fd)
                    os.mkdir(p, dir_fd=fd)
                    nxt = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def host_dir(self, sandbox_path: str, create: bool) -> Path:
        """Host path of a sandbox directory, each component made a real directory under the root (symlinks
        and files in the way are replaced when `create`). Only for use while no agent process runs: a
        path is re-resolved on each use (use `dir_fd` when the agent may be running)."""
        parts = self._parts(sandbox_path)
        if parts and parts[0] in SYSTEM_ENTRIES + SPECIAL_ENTRIES:
            raise SandboxError(f"the local backend cannot write into /{parts[0]} (read-only host system "
                               f"directory): {sandbox_path}; use the docker backend for such environments")
        with self.dir_fd(sandbox_path, create):
            pass
        return self.root.joinpath(*parts)

    def replace_dir(self, host_dir: Path | None, sandbox_path: str) -> None:
        """Make `sandbox_path` a fresh directory holding a copy of host_dir (empty if None)."""
        parent, _, name = sandbox_path.rstrip("/").rpartition("/")
        if not name:
            raise SandboxError(f"cannot replace the sandbox root ({sandbox_path!r})")
        with self.dir_fd(parent or "/", create=True) as fd:
            self.unlink_at(fd, name)
            target = f"/proc/self/fd/{fd}/{name}"  # the magic link pins the resolved parent
            if host_dir is None:
                os.mkdir(name, dir_fd=fd)
            else:
                shutil.copytree(host_dir, target, symlinks=False)

    @staticmethod
    def unlink_at(fd: int, name: str) -> None:
        """Remove entry `name` of directory `fd` (file, symlink or whole tree), following no symlink."""
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(name, dir_fd=fd)

    def remove_file(self, sandbox_path: str) -> None:
        """Remove a file or symlink (never what a symlink points to); absent paths are fine."""
        parent, _, name = sandbox_path.rpartition("/")
        try:
            with self.dir_fd(parent or "/", create=False) as fd:
                self.unlink_at(fd, name)
        except SandboxError:
            pass

    def file_size(self, sandbox_path: str) -> int:
        """Size of `sandbox_path` without following symlinks (0 if absent); safe while the agent runs."""
        parent, _, name = sandbox_path.rpartition("/")
        try:
            with self.dir_fd(parent or "/", create=False) as fd:
                return os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
        except (SandboxError, OSError):
            return 0

    def read_file(self, sandbox_path: str, max_bytes: int = 1 << 20) -> bytes | None:
        parent, _, name = sandbox_path.rstrip("/").rpartition("/")
        try:
            with self.dir_fd(parent or "/", create=False) as d:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d)
        except (SandboxError, OSError):
            return None
        with os.fdopen(fd, "rb") as f:
            if not os.path.isfile(f"/proc/self/fd/{fd}"):
                return None
            return f.read(max_bytes)
