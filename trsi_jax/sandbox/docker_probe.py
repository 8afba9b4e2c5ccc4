"""Progress probes for the docker backend: the task's progress tests run in a separate container of
the task's image (toolchain mounted, no network, the tests in its private /tmp) that sees the agent's
changed top-level entries (and /usr/local) read-only, while the agent's container runs on untouched.
No test file ever enters the agent's container.

The agent's files reach the probe by bind-mounting them from the live container's filesystem on this
host (overlay2's MergedDir: no copy), or, where the storage driver exposes no such path (btrfs, zfs,
a remote dockerd), as archives copied from the live container into the probe container.
"""
from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable

from trsi_jax.sandbox import toolchain
from trsi_jax.sandbox.base import ExecResult, SandboxError, cap_text


def probe(sb, host_tests_dir: Path, make_cmd: Callable[[str], str], timeout_sec: float,
          use_binds: bool = True) -> ExecResult:
    """Run make_cmd(<tests dir>) for DockerSandbox `sb` as described above (`use_binds=False` forces
    the archive path)."""
    import docker  # noqa: PLC0415
    from trsi_jax.sandbox.carry import CARRIED_USR, CONTAINER_MANAGED, SYSTEM_ENTRIES, without
    from trsi_jax.sandbox.docker import CAPS, verifier_path
    if sb._agent_done:  # noqa: SLF001
        raise SandboxError("progress probes run while the agent works, not after stop_processes")
    try:
        sb.container.reload()
        merged = ((sb.container.attrs.get("GraphDriver") or {}).get("Data") or {}).get("MergedDir")  # None: btrfs
        paths = [c["Path"] for c in (sb.container.diff() or [])]
    except docker.errors.APIError as e:
        raise SandboxError(f"could not inspect the container for a probe: {e}") from None
    merged = Path(merged) if use_binds and merged and Path(merged).is_dir() else None
    names = sorted({p.split("/")[1] for p in paths} - SYSTEM_ENTRIES - {"etc", "tmp"})
    if any(p.startswith(f"/{CARRIED_USR}/") for p in paths):
        names.append(CARRIED_USR)
    binds = {}
    if merged is not None:
        for name in names:
            host = merged / name
            if host.is_dir() and not host.is_symlink():  # never a link: it would resolve on the host
                binds[str(host)] = {"bind": f"/{name}", "mode": "ro"}
    tc = toolchain.for_script(sb.task.test_script)
    where = f"/tmp/probe-{uuid.uuid4().hex}"
    lim = sb.limits
    with tempfile.TemporaryDirectory(prefix="trsi-probe-") as tmp:
        shutil.copytree(host_tests_dir, Path(tmp) / "t")
        binds[str(Path(tmp) / "t")] = {"bind": where, "mode": "ro"}
        binds[str(tc)] = {"bind": toolchain.MOUNT, "mode": "ro"}
        try:
            box = sb.client.containers.create(
                sb.image, ["/bin/bash", "-c", make_cmd(where)], init=True, hostname="sandbox",
                working_dir=sb.workdir, network_mode="none", mem_limit=f"{lim.memory_mb}m", pids_limit=lim.pids,
                cap_drop=["ALL"], cap_add=CAPS, security_opt=["no-new-privileges"],
                environment={"PATH": verifier_path(sb._image_path), "HOME": "/root"},  # noqa: SLF001
                tmpfs={"/tmp": "rw,size=256m"}, volumes=binds, labels={"trsi.sandbox": sb.task.task_id})
        except docker.errors.APIError as e:
            raise SandboxError(f"could not create a probe container from {sb.image}: {e}") from None
        try:
            if merged is None:  # copy the agent's entries in before the probe starts
                for name in names:
                    try:
                        stream, _ = sb.container.get_archive(f"/{name}")
                    except docker.errors.NotFound:
                        continue
                    box.put_archive("/" + name.rpartition("/")[0], without(b"".join(stream), CONTAINER_MANAGED))
            box.start()
            try:
                code, timed_out = box.wait(timeout=timeout_sec)["StatusCode"], False
            except Exception:  # noqa: BLE001 (the docker SDK raises requests' timeout types)
                code, timed_out = -1, True
            text, truncated = cap_text(box.logs(), lim.output_bytes)
        except docker.errors.APIError as e:
            raise SandboxError(f"probe container failed: {e}") from None
        finally:
            box.remove(force=True)
    return ExecResult(exit_code=code, output=text, timed_out=timed_out, truncated=truncated)
