"""Per-sandbox disk quota for the local backend: the sandbox root is its own ext4 file system, a sparse
image loop-mounted at `<sandbox dir>/root`, so its size and inode count are the quota (writes past
them fail with ENOSPC) and only what is written takes host disk space. Also keeps host paths out of the
sandbox's mount table (its `/` is the image's root, not a host directory).

Why not project quotas on a shared file system: this kernel has no quota support (CONFIG_QUOTA_V2,
XFS_QUOTA); a file system per sandbox needs none. Images are copied (sparsely) from a template made
once per (size, inodes) with mkfs.ext4, and one spare disk is prepared in the background so that
starting a sandbox does not wait for the mount.
"""
from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from trsi_jax.sandbox.base import SandboxError

IMAGE, ROOT = "disk.img", "root"
_spare: dict[tuple[int, int], Path] = {}  # (size_mb, inodes) -> a prepared sandbox dir
_spare_lock = threading.Lock()
_preparing: set[tuple[int, int]] = set()


def available() -> bool:
    """Whether this machine can loop-mount ext4 images (root, mkfs.ext4, a loop device)."""
    return (os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None and shutil.which("mount") is not None
            and Path("/dev/loop-control").exists())


def _template(size_mb: int, inodes: int) -> Path:
    """A freshly formatted sparse image for this size (made once, shared by every process)."""
    d = Path(tempfile.gettempdir()) / "trsi-disk-templates"
    d.mkdir(exist_ok=True)
    path = d / f"ext4-{size_mb}m-{inodes}i.img"
    if path.exists():
        return path
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            tmp = d / f".{path.name}.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.truncate(size_mb << 20)
            r = subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal,^resize_inode", "-N", str(inodes), "-m",
                                "0", "-E", "lazy_itable_init=1,root_owner=0:0", str(tmp)], capture_output=True)
            if r.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise SandboxError(f"mkfs.ext4 failed for the sandbox disk template: {r.stderr.decode()[-500:]}")
            tmp.rename(path)
    return path


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy only the data extents of a sparse file (a formatted template: ~200 KB of a few GB)."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        fo.truncate(size)
        pos = 0
        while pos < size:
            try:
                pos = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fi.fileno(), pos, os.SEEK_HOLE)
            os.copy_file_range(fi.fileno(), fo.fileno(), end - pos, pos, pos)
            pos = end


def _make(sbx_dir: Path, size_mb: int, inodes: int) -> None:
    """Put a mounted disk at sbx_dir/root."""
    image, root = sbx_dir / IMAGE, sbx_dir / ROOT
    _sparse_copy(_template(size_mb, inodes), image)
    root.mkdir()
    r = subprocess.run(["mount", "-o", "loop,nosuid,nodev,noatime", str(image), str(root)], capture_output=True)
    if r.returncode != 0:
        raise SandboxError(f"could not mount the sandbox disk {image}: {r.stderr.decode().strip()[-500:]}")
    (root / "lost+found").rmdir()


def _prepare_spare(key: tuple[int, int], owner_prefix: str) -> None:
    try:
        d = Path(tempfile.mkdtemp(prefix=owner_prefix))
        try:
            _make(d, *key)
        except BaseException:
            release(d)
            raise
        with _spare_lock:
            if key in _spare:
                release(d)
            else:
                _spare[key] = d
    except (SandboxError, OSError):
        pass  # the next sandbox makes its own disk and reports the error
    finally:
        with _spare_lock:
            _preparing.discard(key)


def acquire(size_mb: int, inodes: int, owner_prefix: str) -> Path:
    """A new sandbox dir (named with `owner_prefix`) whose `root` is a mounted, empty disk."""
    key = (size_mb, inodes)
    with _spare_lock:
        d = _spare.pop(key, None)
        start = key not in _preparing
        _preparing.add(key)
    if start:
        threading.Thread(target=_prepare_spare, args=(key, owner_prefix), daemon=True,
                         name="trsi-disk-spare").start()
    if d is not None:
        return d
    d = Path(tempfile.mkdtemp(prefix=owner_prefix))
    try:
        _make(d, size_mb, inodes)
    except BaseException:
        release(d)
        raise
    return d


def release(sbx_dir: Path) -> None:
    """Unmount (lazily: never blocks on a busy mount) and delete a sandbox dir with its disk."""
    root = sbx_dir / ROOT
    try:
        mounted = root.is_mount()
    except FileNotFoundError:  # another process released it first
        return
    if mounted:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
    shutil.rmtree(sbx_dir, ignore_errors=True)


def release_spares() -> None:
    """Release the prepared spare disks (at exit; a killed process's are swept by the next one)."""
    with _spare_lock:
        spares = list(_spare.values())
        _spare.clear()
    for d in spares:
        release(d)


atexit.register(release_spares)
