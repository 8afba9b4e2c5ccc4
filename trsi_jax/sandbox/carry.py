"""What of the agent's /usr the docker verifier carries besides /usr/local: what an install *added*
(apt-get, dpkg, `make install` to /usr), so tests that run a program the agent installed find it.

Never a change to a file the image has (docker diff kind 0: the image's bash, coreutils and libraries
stay the image's), and never a new command that would run instead of one of the image's: a file in
a PATH directory named like any command on the image's PATH (`/usr/sbin/mkdir` would shadow
`/usr/bin/mkdir`, `/usr/bin/bash` the `/bin/bash` of an image without merged /usr).
"""
from __future__ import annotations

import io
import tarfile

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
