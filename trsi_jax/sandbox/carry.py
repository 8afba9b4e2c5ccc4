"""The docker backend's hand-over from the agent's container to the verifier's (`move_to_fresh_container`).

The agent's changed top-level entries but the system directories, and /usr/local, move into a fresh
container of the same image, so the verifier runs the image's own /usr, loader configuration and
alternatives. Of the rest of /usr it carries what an install *added* (apt-get, dpkg, `make install`
to /usr), so tests that run a program the agent installed find it.

Never a change to a file the image has (docker diff kind 0: the image's bash, coreutils and libraries
stay the image's), and never a new command that would run instead of one of the image's: a file in
a PATH directory named like any command on the image's PATH (`/usr/sbin/mkdir` would shadow
`/usr/bin/mkdir`, `/usr/bin/bash` the `/bin/bash` of an image without merged /usr).
"""
from __future__ import annotations

import io
import shlex
import tarfile

from trsi_jax.sandbox import toolchain
from trsi_jax.sandbox.base import SandboxError

# Top-level entries never carried from the agent's container to the verifier's.
# (/.trsi is where the verifier toolchain is mounted: an agent's /.trsi is never carried.)
SYSTEM_ENTRIES = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "proc", "sys", "dev", ".dockerenv", ".trsi"}
# The dynamic loader's configuration: the verifier keeps the image's, never the agent's.
LOADER_FILES = ("ld.so.preload", "ld.so.cache", "ld.so.conf", "ld.so.conf.d")
# Files docker bind-mounts into every container, the loader's configuration, the alternatives links
# (what /usr/bin/awk, which, ... run, as the local backend binds the host's) and what names modules
# to load (NSS, PAM: with added /usr files carried, they could load the agent's): not carried.
CONTAINER_MANAGED = ({"etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/alternatives", "etc/nsswitch.conf",
                      "etc/pam.d"} | {f"etc/{f}" for f in LOADER_FILES})
# Empty /etc but for what CONTAINER_MANAGED keeps from the image (and docker's mounted files).
CLEAR_ETC = "find /etc -mindepth 1 -maxdepth 1 " + " ".join(
    f"! -name {n.split('/')[1]}" for n in sorted(CONTAINER_MANAGED)) + " -exec rm -rf {} +"
# The one part of /usr carried to the verifier (what `pip install`, `make install`, links to built
# programs write); the verifier's own commands never look there (PRISTINE_PATH, absolute paths).
CARRIED_USR = "usr/local"
ADDED = 1  # docker diff's kind for a path the image does not have


def added_usr_paths(diff: list[dict], image_commands: set[str], path_dirs: set[str]) -> list[str]:
    """Top-most paths under /usr but /usr/local (carried whole) that `diff` (docker's
    [{"Path", "Kind"}]) marks added, minus entries of `path_dirs` named like one of `image_commands`
    and any added directory that is or holds a PATH directory (every command in it would be new)."""
    added = {c["Path"] for c in diff if c.get("Kind") == ADDED}
    out = []
    for path in sorted(added):
        if not path.startswith("/usr/") or path == "/usr/local" or path.startswith("/usr/local/"):
            continue
        parent, name = path.rsplit("/", 1)
        ancestors = ["/".join(path.split("/")[:i]) for i in range(2, path.count("/") + 1)]
        if any(a in added for a in ancestors):  # inside an added directory: its archive holds this one
            continue
        if parent in path_dirs and name in image_commands:
            continue
        if any(d == path or d.startswith(path + "/") for d in path_dirs):  # a PATH dir the image lacks
            continue
        out.append(path)
    return out


def listing_names(ls_output: str) -> set[str]:
    """File names from `ls -1A dir...` output (drops the "dir:" headers and blank lines)."""
    return {line for line in ls_output.splitlines() if line and not (line.startswith("/") and line.endswith(":"))}


def rooted_tar(archives: dict[str, bytes]) -> bytes:
    """One tar of every {path: docker's archive of path} with member names from / (usr/bin/x)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as dst:
        for path, raw in archives.items():
            parent = path.rsplit("/", 1)[0].lstrip("/")
            with tarfile.open(fileobj=io.BytesIO(raw)) as src:
                for member in src:
                    data = src.extractfile(member) if member.isfile() else None
                    member.name = f"{parent}/{member.name.removeprefix('./')}"
                    if member.islnk():  # a hard link names its target by archive path too
                        member.linkname = f"{parent}/{member.linkname.removeprefix('./')}"
                    dst.addfile(member, data)
    return out.getvalue()


def without(tar_bytes: bytes, names: set[str]) -> bytes:
    """The tar archive minus the members called `names` and everything under them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            name = member.name.lstrip("./")
            if not any(name == n or name.startswith(n + "/") for n in names):
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def move_to_fresh_container(sb, keep_services: bool = False) -> None:
    """Carry DockerSandbox `sb`'s agent files (see above) into a fresh container of its image, with
    the verifier toolchain mounted read-only at /.trsi; the agent's container is removed, or with
    `keep_services` (it is paused and holds listening servers) unpaused, kept as `sb.services`, and
    the fresh container joins its network namespace (services.py)."""
    import docker  # noqa: PLC0415
    old = sb.container
    diff = old.diff() or []
    paths = [c["Path"] for c in diff]
    changed = sorted({p.split("/")[1] for p in paths} - SYSTEM_ENTRIES)
    if any(p == f"/{CARRIED_USR}" or p.startswith(f"/{CARRIED_USR}/") for p in paths):
        changed.append(CARRIED_USR)
    bundles = {}
    for name in changed:  # only entries the episode touched (docker diff vs the image)
        try:
            stream, stat = old.get_archive(f"/{name}")
            # /etc holds the runtime's bind mounts (hosts, resolv.conf): one the agent swapped for a
            # link or a file cannot replace the fresh container's; it counts as deleted.
            is_dir = bool(stat.get("mode", 0) & (1 << 31)) and not stat.get("linkTarget")  # Go's ModeDir
            bundles[name] = None if name == "etc" and not is_dir else without(b"".join(stream), CONTAINER_MANAGED)
        except docker.errors.NotFound:  # deleted by the agent
            bundles[name] = None
    try:
        tc = toolchain.for_script(sb.task.test_script)
    except toolchain.ToolchainError as e:
        old.remove(force=True)
        raise SandboxError(str(e)) from None
    try:
        sb._start_container({str(tc): {"bind": toolchain.MOUNT, "mode": "ro"}},
                            network=sb.task.allow_internet or sb.limits.verifier_network,
                            network_of=old.id if keep_services else None)
        sb._pristine = True
        dirs = sb._image_path.split(":")
        # the image's commands and packages (none without dpkg), read before any carry
        commands = listing_names(sb._exec_raw(["/bin/ls", "-1A", *dirs])[1].decode(errors="replace"))
        dpkg = sb._exec_raw(["/bin/sh", "-c", shlex.join(toolchain.DPKG_INSTALLED) + " 2>/dev/null"])[1]
        sb.installed = " ".join(sorted(set(toolchain.dpkg_installed(dpkg.decode(errors="replace"))) | commands))
        usr = {}
        for path in added_usr_paths(diff, commands, set(dirs)):
            try:
                usr[path] = b"".join(old.get_archive(path)[0])
            except docker.errors.NotFound:  # gone between diff and now
                continue
        for name in bundles:  # clear first: from here on no command may run the agent's /usr/local
            sb._exec_raw(["/bin/sh", "-c", CLEAR_ETC] if name == "etc" else ["/bin/rm", "-rf", f"/{name}"])
        for name, data in bundles.items():
            parent = "/" + name.rpartition("/")[0]
            if data is not None and not sb.container.put_archive(parent, data):
                raise SandboxError(f"could not carry /{name} into the verification container")
        # one archive rooted at /: a relative link such as /usr/bin/x -> ../lib/x stays inside it
        if usr and not sb.container.put_archive("/", rooted_tar(usr)):
            raise SandboxError("could not carry the agent's added /usr files into the verification container")
    finally:
        if keep_services and not sb._closed:
            old.unpause()
            sb.services = old
        else:
            old.remove(force=True)
