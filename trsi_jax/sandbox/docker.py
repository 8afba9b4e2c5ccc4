"""The `docker` backend: the task's Dockerfile built by the Docker engine (legacy builder, images cached
by content hash), one container per episode with no network, memory/cpu/pids/rlimits, all
capabilities dropped but a few, no privilege escalation. When the agent is done (`stop_processes`) the
files it changed outside the system directories move into a fresh container of the same image, so the
verifier never runs a /usr the agent (root in its container) could have altered.

No registry is reachable here, so FROM images are mapped to local ones (sandboxes/docker/from_images.txt,
built by sandboxes/docker/build_images.sh). Builds use the machine's network and package sources
(apt, pip); the containers an episode runs in have none unless the task allows internet.
"""
from __future__ import annotations

import fnmatch
import hashlib
import io
import tarfile
import time
from pathlib import Path
from typing import Callable

from trsi_jax.sandbox import dockerfile as dfile
from trsi_jax.sandbox import carry, services, toolchain
from trsi_jax.sandbox.base import (DEFAULT_EXEC_TIMEOUT_SEC, ExecResult, Limits,
                                   OutputCollector, Sandbox, SandboxError)
from trsi_jax.sandbox.terminal import TMUX_CONF, Terminal
from trsi_jax.tasks import Task

# A build may download and compile for long (pip wheels, toolchains); past this it is reported as failed.
DOCKER_BUILD_TIMEOUT_SEC = 3600
FROM_MAP = Path(__file__).resolve().parents[2] / "sandboxes" / "docker" / "from_images.txt"
CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE", "SYS_CHROOT"]
RUN_DIR = "/run/trsi"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The verifier's own commands never look in the carried /usr/local (carry.py).
PRISTINE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def verifier_path(image_path: str) -> str:
    """The toolchain's shims, then the image's PATH with /usr/local moved last: programs the agent
    installed there are found, but never instead of the image's own."""
    dirs = image_path.split(":")
    local = [d for d in dirs if d.startswith("/usr/local")]
    return ":".join([toolchain.SHIMS] + [d for d in dirs if d not in local] + local)
# Make "$1" a fresh empty directory, replacing any symlink or file on the way (as the local backend does).
MAKE_DIR = ('p=; IFS=/; for c in $1; do [ -n "$c" ] || continue; p="$p/$c"; '
            'if [ -L "$p" ] || { [ -e "$p" ] && [ ! -d "$p" ]; }; then rm -f "$p"; fi; '
            '[ -d "$p" ] || mkdir "$p" || exit 1; done; rm -rf "$p" && mkdir "$p"')
# The pids in the container other than init (pid 1) and this shell: right after start, the keep-alive.
LIST_PIDS = 'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || echo "$p"; done'
# Kill every process but init and the keep-alive ($KEEP), repeating until none is left.
KILL_ALL = ('for i in 1 2 3 4 5 6 7 8; do n=0; for d in /proc/[0-9]*; do p=${d#/proc/}; '
            '[ "$p" = 1 ] || [ "$p" = "$KEEP" ] || [ "$p" = $$ ] && continue; kill -9 "$p" 2>/dev/null && n=1; done; '
            '[ $n = 0 ] && break; sleep 0.05; done')


def load_from_map(path: Path = FROM_MAP) -> list[tuple[str, str]]:
    rules = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            parts = line.split()
            if len(parts) != 2:
                raise SandboxError(f"{path}:{i}: expected '<glob> <local image>', got {line!r}")
            rules.append((parts[0], parts[1]))
    return rules


def map_image(image: str, rules: list[tuple[str, str]]) -> str:
    """The local image standing in for `image` (first matching glob), else `image` itself."""
    return next((local for pattern, local in rules if fnmatch.fnmatchcase(image, pattern)), image)


def _client():
    import docker  # noqa: PLC0415 (optional at import time: only this backend needs the SDK)
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:  # noqa: BLE001 (any failure to reach dockerd means the same to callers)
        raise SandboxError(f"docker engine unreachable ({e}); start dockerd or use backend='local'") from None
    return client


def apt_for_tests(task: Task) -> tuple[str, ...]:
    """What the task's test scripts apt-get install (test.sh and any other *.sh under tests/, such as
    the verify.sh configure-git-webserver's tests run): built into the image, since the verifier's
    apt-get installs nothing."""
    scripts = [task.test_script, *sorted(p for p in task.tests_dir.rglob("*.sh") if p != task.test_script)]
    return toolchain.requested_apt("\n".join(p.read_text(errors="replace") for p in scripts if p.is_file()))


def _build_context(task: Task, rules) -> tuple[bytes, str]:
    """(tar of the filtered context + the Dockerfile with FROM/COPY --from images mapped and the test
    script's apt packages installed last, content hash)."""
    env = task.environment
    text = dfile.map_images(env.dockerfile, lambda image: map_image(image, rules))
    text = dfile.with_packages(text, apt_for_tests(task))
    digest = hashlib.sha256(text.encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in dfile.context_files(env.context_dir):
            if str(rel) == "Dockerfile":
                continue
            p = env.context_dir / rel
            tar.add(p, arcname=str(rel), recursive=False)
            digest.update(str(rel).encode() + oct(p.lstat().st_mode).encode())
            if p.is_file() and not p.is_symlink():
                digest.update(hashlib.sha256(p.read_bytes()).digest())
        data = text.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), digest.hexdigest()[:16]


def _base_images(client, text: str) -> dict[str, str | None]:
    """The mapped base images (FROM / COPY --from) the Dockerfile needs -> local image id (None: missing)."""
    import docker  # noqa: PLC0415
    stages, needed = set(), []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "FROM":
            if words[1] not in stages and words[1].lower() != "scratch":
                needed.append(words[1])
            if len(words) == 4:
                stages.add(words[3])
        needed += [w[len("--from="):] for w in words[1:] if w.startswith("--from=")
                   and w[len("--from="):] not in stages and not w[len("--from="):].isdigit()]
    ids = {}
    for image in dict.fromkeys(needed):
        try:
            ids[image] = client.images.get(image).id
        except docker.errors.ImageNotFound:
            ids[image] = None
    return ids


def ensure_image(client, task: Task, rules=None) -> str:
    """Tag of the task's image, built once per content hash (legacy builder; the build may use the
    machine's network and package sources, the containers run without)."""
    import docker  # noqa: PLC0415
    import requests  # noqa: PLC0415 (the docker SDK's transport)
    rules = load_from_map() if rules is None else rules
    if task.environment.dockerfile is None:
        return map_image(task.environment.docker_image, rules)
    try:
        context, digest = _build_context(task, rules)
    except dfile.DockerfileError as e:
        raise SandboxError(str(e)) from None
    bases = _base_images(client, dfile.map_images(task.environment.dockerfile, lambda i: map_image(i, rules)))
    missing = [image for image, image_id in bases.items() if image_id is None]
    if missing:
        raise SandboxError(f"{task.environment.dockerfile}: base image(s) {', '.join(missing)} not present locally "
                           f"(no registry here): run sandboxes/docker/build_images.sh, or map them in {FROM_MAP}")
    # The tag names the context and the base images' ids: a rebuilt base image means a rebuilt task image.
    tag = "trsi/task:" + hashlib.sha256((digest + "".join(sorted(bases.values()))).encode()).hexdigest()[:16]
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.build(fileobj=io.BytesIO(context), custom_context=True, tag=tag, rm=True, forcerm=True,
                            pull=False, network_mode="bridge", timeout=DOCKER_BUILD_TIMEOUT_SEC)
    except docker.errors.BuildError as e:
        log = "".join(x.get("stream", "") or x.get("error", "") for x in e.build_log)[-2000:]
        raise SandboxError(f"{task.environment.dockerfile}: docker build failed: {e.msg}\n{log}") from None
    except docker.errors.APIError as e:
        raise SandboxError(f"{task.environment.dockerfile}: docker build failed: {e}") from None
    except requests.exceptions.RequestException as e:  # the engine did not answer within the timeout
        raise SandboxError(f"{task.environment.dockerfile}: docker build did not finish in "
                           f"{DOCKER_BUILD_TIMEOUT_SEC} s ({type(e).__name__})") from None
    return tag


def _disk_quota(client, lim: Limits, image: str) -> dict | None:
    """`--storage-opt size` where the storage driver enforces it (btrfs, zfs, overlay2 on XFS mounted with
    pquota), else None: then the container's writes are bounded only per file (RLIMIT_FSIZE), which the
    README states. Inodes are not capped separately (each costs bytes of the size cap where one exists).
    btrfs counts the image's own bytes against the limit (a qgroup's referenced bytes), so its limit is
    the image's size plus `disk_mb`."""
    if lim.disk_mb <= 0 or not enforces_disk_quota(client):
        return None
    if client.info().get("Driver") == "btrfs":
        return {"size": f"{lim.disk_mb + (client.images.get(image).attrs['Size'] >> 20) + 1}M"}
    return {"size": f"{lim.disk_mb}M"}


def enforces_disk_quota(client) -> bool:
    """Whether dockerd's storage driver enforces `--storage-opt size`."""
    info = client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
    return info.get("Driver") in ("btrfs", "zfs") or (info.get("Driver") == "overlay2" and backing == "xfs")


class DockerSandbox(Sandbox):
    """One container per episode from the task's (cached) image."""

    def __init__(self, task: Task, limits: Limits | None = None):
        import docker  # noqa: PLC0415
        self.task = task
        self.limits = limits or Limits.for_task(task)
        self.client = _client()
        self._terminal: Terminal | None = None
        self._closed = False
        self._agent_done = False  # set by stop_processes: from then on only the verifier runs
        self._pristine = False  # set once the container may hold the agent's /usr/local (see _exec_raw)
        self.installed = ""  # the image's packages and commands, set by the carry (toolchain.INSTALLED_ENV)
        image = ensure_image(self.client, task)
        try:
            config = self.client.images.get(image).attrs["Config"]
            workdir = config.get("WorkingDir") or task.environment.workdir
        except docker.errors.ImageNotFound:
            raise SandboxError(f"image {image} not found locally (no registry here): map it in {FROM_MAP} "
                               "or build it (sandboxes/docker/build_images.sh)") from None
        self.workdir = workdir
        self.image = image
        self._image_path = next((e[5:] for e in config.get("Env") or [] if e.startswith("PATH=")), DEFAULT_PATH)
        self.container = None
        self.services = None  # the agent's container, kept while its servers answer the tests (services.py)
        self.api = self.client.api
        self._start_container()

    def _start_container(self, mounts: dict | None = None, network: bool | None = None,
                         network_of: str | None = None) -> None:
        """A fresh container of self.image with the sandbox's limits (and docker `volumes` mounts),
        on the bridge network if `network` (default: the task's allow_internet), or in the network
        namespace of container `network_of`; records its keep-alive pid."""
        import docker  # noqa: PLC0415
        lim = self.limits
        ulimits = [docker.types.Ulimit(name="cpu", soft=lim.cpu_sec, hard=lim.cpu_sec),
                   docker.types.Ulimit(name="fsize", soft=lim.file_size_mb << 20, hard=lim.file_size_mb << 20),
                   docker.types.Ulimit(name="nofile", soft=lim.nofile, hard=lim.nofile),
                   docker.types.Ulimit(name="core", soft=0, hard=0)]
        if network_of:  # docker refuses a hostname of its own in another container's namespace
            net = {"network_mode": f"container:{network_of}"}
        else:
            online = self.task.allow_internet if network is None else network
            net = {"network_mode": "bridge" if online else "none", "hostname": "sandbox"}
        try:
            self.container = self.client.containers.run(
                self.image, ["sleep", "infinity"], detach=True, init=True, working_dir=self.workdir, **net,
                mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m", nano_cpus=int(lim.cpus * 1e9),
                pids_limit=lim.pids, cap_drop=["ALL"], cap_add=CAPS, security_opt=["no-new-privileges"],
                privileged=False, ulimits=ulimits, labels={"trsi.sandbox": self.task.task_id}, volumes=mounts or {},
                storage_opt=_disk_quota(self.client, lim, self.image))
        except docker.errors.APIError as e:
            raise SandboxError(f"could not start a container from {self.image}: {e}") from None
        try:
            self._mkdir(self.workdir)
            code, out = self._exec_raw(["sh", "-c", LIST_PIDS])
            self._keep_pid = out.decode().split()
            if code != 0 or len(self._keep_pid) != 1:
                raise SandboxError(f"could not identify the container's keep-alive process: {out!r}")
        except BaseException:
            self.close()
            raise

    # ---- commands -----------------------------------------------------------------------------
    def _exec_raw(self, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, bytes]:
        """Run argv to completion; (exit code, combined output). Only for the backend's own short,
        bounded commands; agent-facing commands go through `exec` (timeout, output cap)."""
        import docker  # noqa: PLC0415
        if self._closed:
            raise SandboxError("sandbox is closed")
        if self._pristine:  # the verifier's container holds the agent's /usr/local: never look there
            env = {"PATH": PRISTINE_PATH, **(env or {})}
        try:
            eid = self.api.exec_create(self.container.id, argv, environment=env, workdir="/")["Id"]
            out = self.api.exec_start(eid, stream=False)
            code = self.api.exec_inspect(eid)["ExitCode"]
        except docker.errors.APIError as e:
            raise SandboxError(f"container {self.container.short_id} failed: {e}") from None
        return code, out

    def _mkdir(self, path: str) -> None:
        code, out = self._exec_raw(["/bin/mkdir", "-p", path])
        if code != 0:
            raise SandboxError(f"mkdir {path} failed in the container: {out.decode(errors='replace')}")

    def exec(self, cmd: str, timeout_sec: float = DEFAULT_EXEC_TIMEOUT_SEC, *, env: dict[str, str] | None = None,
             with_pytest: bool = False) -> ExecResult:
        import docker  # noqa: PLC0415
        if self._closed:
            raise SandboxError("sandbox is closed")
        if with_pytest:  # the verifier: the toolchain's shims first on PATH (see toolchain.py)
            if not self._agent_done:
                raise SandboxError("with_pytest runs only after stop_processes (the verifier's container)")
            env = {**(env or {}), "PATH": verifier_path(self._image_path), "HOME": "/root",
                   toolchain.INSTALLED_ENV: self.installed}
        # GNU timeout kills the command's whole process group, then SIGKILLs it a second later.
        argv = ["/usr/bin/timeout", "--kill-after=1", f"{timeout_sec:.3f}", "/bin/bash", "-c", cmd]
        start = time.monotonic()
        try:
            self.container.reload()
            if self.container.status != "running":
                raise SandboxError(f"container {self.container.short_id} is {self.container.status}")
            eid = self.api.exec_create(self.container.id, argv, environment=env, workdir=self.workdir)["Id"]
            out = OutputCollector(self.api.exec_start(eid, stream=True), self.limits.output_bytes)
            text, truncated = out.result(join_timeout=timeout_sec + 10)
            code = self.api.exec_inspect(eid)["ExitCode"]
        except docker.errors.APIError as e:
            raise SandboxError(f"container {self.container.short_id} failed: {e}") from None
        if with_pytest and self._agent_done:  # nothing the tests started may outlive them and rewrite results
            self._exec_raw(["/bin/sh", "-c", KILL_ALL], env={"KEEP": self._keep_pid[0]})
        timed_out = code is None or (code in (124, 137) and time.monotonic() - start >= timeout_sec)
        return ExecResult(exit_code=-1 if timed_out else code, output=text,
                          timed_out=timed_out, truncated=truncated)

    def terminal(self) -> Terminal:
        """tmux inside the container, driven by `docker exec tmux ...`."""
        if self._terminal is not None:
            return self._terminal
        self._mkdir(RUN_DIR)
        self._put_bytes(RUN_DIR, {"tmux.conf": TMUX_CONF.encode()})
        sock = f"{RUN_DIR}/tmux.sock"

        def run_tmux(args: list[str]) -> str:
            code, out = self._exec_raw(["tmux", "-S", sock, "-f", f"{RUN_DIR}/tmux.conf", *args])
            if code != 0:
                raise SandboxError(f"tmux {args[0]} failed in the container: {out.decode(errors='replace').strip()}")
            return out.decode("utf-8", "replace")

        def read_counter() -> int:
            code, out = self._exec_raw(["stat", "-c", "%s", f"{RUN_DIR}/prompt"])
            return int(out.strip()) if code == 0 and out.strip().isdigit() else 0

        def wait_counter(target: int, budget: float) -> bool:  # poll inside the container: one exec
            loop = (f'while [ "$(stat -c %s {RUN_DIR}/prompt 2>/dev/null || echo 0)" -lt {int(target)} ]; '
                    'do sleep 0.02; done')
            code, _ = self._exec_raw(["timeout", f"{max(budget, 0.01):.3f}", "sh", "-c", loop])
            return code == 0

        self._terminal = Terminal(run_tmux, read_counter, self.workdir, f"{RUN_DIR}/prompt", wait_counter)
        return self._terminal

    # ---- files --------------------------------------------------------------------------------
    def _put_bytes(self, directory: str, files: dict[str, bytes]) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        if not self.container.put_archive(directory, buf.getvalue()):
            raise SandboxError(f"could not copy files into {directory}")

    def stop_processes(self) -> None:
        if self._terminal is not None:
            self._terminal.closed = True
            self._terminal = None
        keep = bool(services.container_listeners(self.container))
        if keep:  # frozen while its files are carried, thawed for the tests to reach its servers
            self.container.pause()
        else:
            self._exec_raw(["sh", "-c", KILL_ALL], env={"KEEP": self._keep_pid[0]})
        carry.move_to_fresh_container(self, keep_services=keep)
        self._agent_done = True

    def put_dir(self, host_dir: Path | None, sandbox_path: str) -> None:
        code, out = self._exec_raw(["/bin/sh", "-c", MAKE_DIR, "sh", sandbox_path])
        if code != 0:
            raise SandboxError(f"could not reset {sandbox_path}: {out.decode(errors='replace')}")
        if host_dir is not None:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for child in sorted(Path(host_dir).iterdir()):
                    tar.add(child, arcname=child.name)
            if not self.container.put_archive(sandbox_path, buf.getvalue()):
                raise SandboxError(f"could not copy {host_dir} into {sandbox_path}")

    def read_file(self, sandbox_path: str, max_bytes: int = 1 << 20) -> bytes | None:
        import docker  # noqa: PLC0415
        try:
            stream, stat = self.container.get_archive(sandbox_path)
        except docker.errors.NotFound:
            return None
        if stat.get("linkTarget") or stat.get("size", 0) > max_bytes * 4:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                return None
            return tar.extractfile(member).read(max_bytes)

    def probe_exec(self, host_tests_dir: Path, make_cmd: Callable[[str], str], timeout_sec: float) -> ExecResult:
        """A separate container sees the agent's files read-only; the tests never enter this one
        (docker_probe.py)."""
        from trsi_jax.sandbox.docker_probe import probe  # noqa: PLC0415
        return probe(self, host_tests_dir, make_cmd, timeout_sec)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._terminal is not None:
            self._terminal.closed = True
        for container in (getattr(self, "container", None), getattr(self, "services", None)):
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception:  # noqa: BLE001 (already gone is fine)
                    pass
