"""The `local` backend: bubblewrap over a private root directory per sandbox, no daemon.

Layout: `<tmp>/trsi-sbx-*/root` is the sandbox's `/` (workdir, /tmp, /root, a private minimal /etc,
...). Host system directories (/usr and the /bin, /lib* links) are bound read-only on top; nothing
else of the host is visible (not the task folder, not the project). Every command runs in its own
bwrap (new pid/net/ipc/uts namespaces, all capabilities dropped but a docker-like few, rlimits via
prlimit, all joined to one per-sandbox pids+memory cgroup); the terminal is one long-lived bwrap
running a tmux server. Verification and progress probes use a root rebuilt from the sandbox's
top-level entries (with the host's dynamic-loader configuration), so whatever the agent did to /bin,
/lib or /etc/ld.so.* cannot reach the verifier, and use the verifier toolchain (toolchain.py) at /.trsi.

Consequences callers should know: files persist across commands, processes do not (each `exec` has
its own pid and network namespace; a server started in the terminal is reachable only from the
terminal), and `verify` kills every agent process first, so tests must check state on disk.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable

from trsi_jax.sandbox import apt_standin
from trsi_jax.sandbox import disk
from trsi_jax.sandbox import dockerfile as dfile
from trsi_jax.sandbox import seccomp
from trsi_jax.sandbox import toolchain
from trsi_jax.sandbox.base import (BUILD_TIMEOUT_SEC, DEFAULT_EXEC_TIMEOUT_SEC, ExecResult, Limits,
                                   OutputCollector, Sandbox, SandboxError)
from trsi_jax.sandbox.cgroup import Cgroup, owner_alive
from trsi_jax.sandbox.netns import Network
from trsi_jax.sandbox.rootfs import SPECIAL_ENTRIES, SYSTEM_ENTRIES, RootFS, remove, system_binds
from trsi_jax.sandbox.terminal import CLIENT_LOOP, TMUX_SET_OPTIONS, PipeClient, Terminal
from trsi_jax.tasks import Task

# Capabilities root keeps inside (docker's default set minus mknod/net_raw/setfcap/setpcap/audit_write;
# sys_chroot because sshd's privilege separation chroots every connection: without it sshd resets them).
CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETUID", "CAP_SETGID",
        "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT")
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
            "LANG": "C.UTF-8", "TERM": "xterm-256color", "USER": "root", "SHELL": "/bin/bash"}
# Host programs the backend runs: bubblewrap for every command, tmux for the terminal.
HOST_TOOLS = (("bwrap", "bubblewrap"), ("tmux", "tmux"))
# The dynamic loader's configuration: the verifier's comes from the host, never from the sandbox's /etc.
LOADER_FILES = ("ld.so.preload", "ld.so.cache", "ld.so.conf", "ld.so.conf.d")
RUN_DIR = "/run/trsi"  # the terminal's socket and prompt counter


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding `data`, positioned at its start (for bwrap to read)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


_SWEEP_LOCK = threading.Lock()


def _sweep_stale() -> None:
    """Remove what sandboxes of dead processes (killed before `close`) left: root dirs and cgroups.
    One thread at a time: sandboxes start from many threads at once, and a dir removed under a
    concurrent sweep's feet used to fail that sandbox's start."""
    with _SWEEP_LOCK:
        for d in Path(tempfile.gettempdir()).glob("trsi-sbx-*-*"):
            if not owner_alive(d.name.split("-")[2]):
                disk.release(d)
        Cgroup.sweep_stale()


class LocalSandbox(Sandbox):
    """A bubblewrap sandbox built from the task's Dockerfile subset (RUN lines run inside it)."""

    def __init__(self, task: Task, limits: Limits | None = None):
        if limits is not None and limits.verifier_network:
            raise SandboxError("Limits.verifier_network is implemented on the docker backend only: use "
                               "backend='docker', or leave it off (the offline toolchain stands in)")
        if os.geteuid() != 0:
            raise SandboxError(f"the local backend needs root (bubblewrap with capability control and cgroups); "
                               f"running as uid {os.geteuid()}: use backend='docker' or run as root")
        missing = [f"{tool} (Debian package {pkg})" for tool, pkg in HOST_TOOLS if shutil.which(tool) is None]
        if missing:
            raise SandboxError(f"the local backend needs {', '.join(missing)} on the host; install with "
                               f"`bash scripts/setup_system.sh demo` (as root) or use backend='docker'")
        self.task = task
        self.limits = limits or Limits.for_task(task)
        _sweep_stale()
        prefix = f"trsi-sbx-{os.getpid()}-"  # owner pid: see _sweep_stale
        if self.limits.disk_mb > 0 and disk.available():  # the root on its own size/inode-capped disk
            self._dir = disk.acquire(self.limits.disk_mb, self.limits.inodes, prefix)
        else:
            if self.limits.disk_mb > 0:
                warnings.warn("local sandboxes run without a disk quota: loop-mounting an ext4 image needs root, "
                              "mkfs.ext4 (e2fsprogs) and /dev/loop-control", stacklevel=2)
            self._dir = Path(tempfile.mkdtemp(prefix=prefix))
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._terminal = None
        self._closed = False
        # The per-sandbox pids+memory cgroup every process joins; None where cgroups are not writable.
        self.cgroup = Cgroup.create(self.limits.pids, self.limits.memory_mb << 20)
        self.env = dict(BASE_ENV)
        self.workdir = task.environment.workdir
        self.net = None
        try:
            self.net = Network() if task.allow_internet else None  # own namespace, outbound NAT only
            self.fs = RootFS(self._dir / "root", task.allow_internet)
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        """Replay the Dockerfile subset: WORKDIR/ENV/COPY on the host side, RUN inside the sandbox, with
        `apt-get`/`apt` answered by a stand-in (see apt_standin) that is removed before the agent starts."""
        env_cfg = self.task.environment
        if env_cfg.dockerfile is None:
            self.fs.host_dir(self.workdir, create=True)
            return
        try:
            spec = dfile.parse_dockerfile(env_cfg.dockerfile)
        except dfile.DockerfileError as e:
            raise SandboxError(str(e)) from None
        tools = self.fs.host_dir(f"{apt_standin.BUILD_DIR}/bin", create=True)
        for name in ("apt-get", "apt"):
            (tools / name).write_text(apt_standin.SCRIPT)
            (tools / name).chmod(0o755)
        (tools.parent / "host-packages").write_text(apt_standin.host_packages())
        cwd = "/"
        try:
            for step in spec.steps:
                if step.kind == "workdir":
                    cwd = step.args[0]
                    self.fs.host_dir(cwd, create=True)
                elif step.kind == "env":
                    self.env.update(dict(step.args))
                elif step.kind == "copy":
                    self.fs.copy_in(env_cfg.context_dir, *step.args, cwd=cwd, where=f"{spec.path}:{step.line}")
                elif step.kind == "run":
                    build_env = {**self.env, "PATH": f"{apt_standin.BUILD_DIR}/bin:{self.env.get('PATH', '')}"}
                    res = self._run(["bash", "-c", step.args[0]], cwd=cwd, env=build_env,
                                    timeout_sec=BUILD_TIMEOUT_SEC)
                    if res.exit_code != 0:
                        raise SandboxError(
                            f"{spec.path}:{step.line}: RUN failed (exit {res.exit_code}"
                            f"{', timed out' if res.timed_out else ''}) on the local backend, which runs it on "
                            f"the host's read-only /usr without network; if this step installs or downloads "
                            f"software, use --backend=docker. Output: {res.output[-2000:]}")
        finally:
            remove(self.fs.host_dir(apt_standin.BUILD_DIR, create=True))
        self.workdir = spec.workdir or self.workdir
        self.fs.host_dir(self.workdir, create=True)

    @property
    def root(self) -> Path:
        """The host directory that is this sandbox's `/`."""
        return self.fs.root

    # ---- running commands ---------------------------------------------------------------------
    def _bwrap(self, argv: list[str], *, cwd: str, env: dict[str, str], rebuilt_root: bool = False,
               extra: list[str] = (), tmpfs_tmp: bool = False) -> list[str]:
        if self._closed:
            raise SandboxError("sandbox is closed")
        if not self.root.is_dir():
            raise SandboxError(f"sandbox root {self.root} vanished")
        a = ["bwrap"]
        if rebuilt_root:  # verifier/probe: a fresh root from the sandbox's own entries, host system dirs
            a += ["--tmpfs", "/"] + self._rebuilt_root(read_only=tmpfs_tmp)
        else:
            # /etc bound onto itself: as a mount point the agent cannot rename it or swap in a symlink that
            # would lead bwrap's mount points below it (/etc/alternatives, ...) to host paths via /oldroot
            a += ["--bind", str(self.root), "/", "--bind", str(self.root / "etc"), "/etc"]
        a += system_binds(None if rebuilt_root else self.root) + self.fs.etc_binds + ["--dev", "/dev", "--proc", "/proc"]
        if tmpfs_tmp:
            a += ["--tmpfs", "/tmp"]
        a += list(extra)
        a += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
        if not self.task.allow_internet:
            a += ["--unshare-net"]
        a += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        for cap in CAPS + ("CAP_SETPCAP",):  # setpcap: only for setpriv below, which drops it
            a += ["--cap-add", cap]
        a += ["--clearenv"]
        for k, v in env.items():
            a += ["--setenv", k, v]
        a += ["--chdir", cwd, "--"]
        lim = self.limits
        keep = ",".join("+" + c[4:].lower() for c in CAPS)  # bwrap leaves the bounding set full: cut it
        a += ["setpriv", f"--bounding-set=-all,{keep}", f"--inh-caps=-all,{keep}", f"--ambient-caps=-all,{keep}", "--"]
        a += ["prlimit", f"--cpu={lim.cpu_sec}", f"--fsize={lim.file_size_mb << 20}", f"--nofile={lim.nofile}",
              "--core=0"]
        if self.cgroup is None:  # no cgroup to cap memory: cap each process's address space
            a += [f"--as={lim.memory_mb << 20}"]
        a += ["--"] + argv
        if self.cgroup is not None:  # join the sandbox cgroup before bwrap starts anything
            join = " && ".join(f"echo $$ > {shlex.quote(f)}" for f in self.cgroup.procs_files)
            a = ["/bin/sh", "-c", f'{join} && exec "$@"', "sh"] + (self.net.enter() if self.net else []) + a
        elif self.net is not None:
            a = self.net.enter() + a
        return a

    def _spawn(self, argv: list[str], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
               stderr=subprocess.STDOUT) -> subprocess.Popen:
        """Start argv (a `_bwrap` command line); bwrap reads its arguments from a memfd (`--args`), so
        the sandbox's /proc/1/cmdline shows `bwrap --args N`, not host paths, and its seccomp filter
        (seccomp.py) from another."""
        i = argv.index("bwrap")
        j = next(k for k in range(i, len(argv) - 2) if argv[k] == "--chdir" and argv[k + 2] == "--") + 2
        fds = []
        try:
            options = argv[i + 1:j]
            if (bpf := seccomp.program()) is not None:
                fds.append(_memfd("bwrap-seccomp", bpf))
                options = options + ["--seccomp", str(fds[-1])]
            fds.append(_memfd("bwrap-args", b"".join(x.encode() + b"\0" for x in options)))
            proc = subprocess.Popen(argv[:i + 1] + ["--args", str(fds[-1])] + argv[j:], stdin=stdin,
                                    stdout=stdout, stderr=stderr, start_new_session=True, pass_fds=fds,
                                    env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            self._procs.add(proc)
        return proc

    def _spawn_kept(self, argv: list[str], stdin=subprocess.DEVNULL) -> subprocess.Popen:
        """Spawn a long-lived process from a thread that lives exactly as long as it does:
        --die-with-parent ties bwrap to the spawning *thread*, which may be a short-lived worker."""
        box: dict = {}
        ready = threading.Event()

        def keeper():
            try:
                piped = stdin == subprocess.PIPE  # a client loop: stdout is its answers, stderr dropped
                box["proc"] = self._spawn(argv, stdout=subprocess.PIPE if piped else subprocess.DEVNULL, stdin=stdin,
                                          stderr=subprocess.DEVNULL if piped else subprocess.STDOUT)
            except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
                box["error"] = e
            ready.set()
            if "proc" in box:
                box["proc"].wait()

        threading.Thread(target=keeper, daemon=True, name="trsi-sandbox-keeper").start()
        ready.wait()
        if "error" in box:
            raise box["error"]
        return box["proc"]

    def _kill(self, proc: subprocess.Popen) -> None:
        """Kill bwrap's outer process: its pid-1 child then dies (--die-with-parent) and takes the pid
        namespace, hence every process the command started, with it."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        with self._lock:
            self._procs.discard(proc)

    def _run(self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_sec: float, **bw) -> ExecResult:
        proc = self._spawn(self._bwrap(argv, cwd=cwd, env=env, **bw))
        out = OutputCollector.from_stream(proc.stdout, self.limits.output_bytes)
        timed_out = False
        try:
            code = proc.wait(timeout=timeout_sec)
        except subprocess.TimeoutExpired:
            timed_out, code = True, -1
        self._kill(proc)
        text, truncated = out.result()
        proc.stdout.close()
        if code == 1 and text.startswith("bwrap:"):
            raise SandboxError(f"bubblewrap failed: {text.strip()[:500]}")
        return ExecResult(exit_code=code, output=text, timed_out=timed_out, truncated=truncated)

    def exec(self, cmd: str, timeout_sec: float = DEFAULT_EXEC_TIMEOUT_SEC, *, env: dict[str, str] | None = None,
             with_pytest: bool = False) -> ExecResult:
        full_env = {**self.env, **(env or {})}
        extra: list[str] = []
        if with_pytest:
            extra, full_env = self._pytest_binds(full_env)
        return self._run(["bash", "-c", cmd], cwd=self.workdir, env=full_env, timeout_sec=timeout_sec,
                         rebuilt_root=with_pytest, extra=extra)

    def _rebuilt_root(self, read_only: bool) -> list[str]:
        """bwrap args rebuilding / from the sandbox's top-level entries (not the system dirs, not a /.trsi
        of the agent's: the toolchain goes there) with /etc entry by entry minus the dynamic loader's
        configuration, which comes from the host (the verifier never loads a library the agent chose)."""
        a: list[str] = []
        bind = "--ro-bind" if read_only else "--bind"
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if name in SYSTEM_ENTRIES + SPECIAL_ENTRIES + (".trsi",) or (read_only and name == "tmp"):
                continue
            if name == "etc" and entry.is_dir() and not entry.is_symlink():
                for child in sorted(entry.iterdir()):
                    if child.name in LOADER_FILES:
                        continue
                    if child.is_symlink():
                        a += ["--symlink", os.readlink(child), f"/etc/{child.name}"]
                    elif child.is_dir() or child.is_file():
                        a += [bind, str(child), f"/etc/{child.name}"]
                a += [x for f in LOADER_FILES if Path("/etc", f).exists() for x in ("--ro-bind", f"/etc/{f}", f"/etc/{f}")]
            elif entry.is_symlink():
                a += ["--symlink", os.readlink(entry), f"/{name}"]
            elif entry.is_dir() or entry.is_file():
                a += [bind, str(entry), f"/{name}"]
        return a

    def _pytest_binds(self, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The verifier toolchain (toolchain.py) read-only at /.trsi with its shims first on PATH; only
        for the verifier and probes, which run on a rebuilt root."""
        try:
            tc = toolchain.for_script(self.task.test_script)
        except toolchain.ToolchainError as e:
            raise SandboxError(str(e)) from None
        return ["--ro-bind", str(tc), toolchain.MOUNT], {
            **env, "PATH": f"{toolchain.SHIMS}:{env.get('PATH', BASE_ENV['PATH'])}", "HOME": env.get("HOME", "/root"),
            toolchain.INSTALLED_ENV: apt_standin.host_installed(BASE_ENV["PATH"])}

    def terminal(self) -> Terminal:
        """The episode's terminal: a bwrap running `tmux -D` (a foreground server) with its socket at
        /run/trsi/tmux.sock, and a second bwrap (its own pid namespace, out of the agent's reach) running
        the tmux client loop the host talks to over pipes. No host process opens the socket or any other
        agent-controlled path: a server the agent swapped in only ever talks to the sandboxed client."""
        if self._terminal is not None:
            return self._terminal
        if shutil.which("tmux") is None:
            raise SandboxError("tmux is not installed on the host (apt-get install tmux)")
        server = self._spawn_kept(self._bwrap(
            ["bash", "-c", f"mkdir -p {RUN_DIR} && exec tmux -D -S {RUN_DIR}/tmux.sock -f /dev/null"],
            cwd=self.workdir, env=self.env))
        client_env = {"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"}
        shim = self._spawn_kept(self._bwrap(["bash", "-c", CLIENT_LOOP, "tmux-client", f"{RUN_DIR}/tmux.sock"],
                                            cwd="/", env=client_env), stdin=subprocess.PIPE)
        client = PipeClient(shim.stdin, shim.stdout)

        def run_tmux(args: list[str]) -> str:
            if server.poll() is not None:
                raise SandboxError("the sandbox's terminal (tmux server) died")
            code, out = client(args)
            if code != 0:
                raise SandboxError(f"tmux {args[0]} failed: {out.strip()[:500]}")
            return out

        # 30 s: a start bound, not a wait. With 32 sandboxes starting while the model decodes on every
        # core, 7 of 80 episodes once ended as sandbox_error at 10 s (suspected cause, not reproduced);
        # a server that died still fails at once.
        deadline = time.monotonic() + 30.0
        while client(TMUX_SET_OPTIONS)[0] != 0:  # until the server listens
            if server.poll() is not None or time.monotonic() > deadline:
                raise SandboxError(f"tmux server did not start in the sandbox (exit {server.poll()})")
            time.sleep(0.005)
        self._terminal = Terminal(run_tmux, lambda: self.fs.file_size(f"{RUN_DIR}/prompt"), self.workdir,
                                  f"{RUN_DIR}/prompt")
        return self._terminal

    def stop_processes(self) -> None:
        if self._terminal is not None:
            self._terminal.closed = True
            self._terminal = None
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            self._kill(p)
        if self.cgroup is not None:
            self.cgroup.kill_all()
        self.fs.remove_file("/etc/ld.so.preload")

    def put_dir(self, host_dir: Path | None, sandbox_path: str) -> None:
        self.fs.replace_dir(host_dir, sandbox_path)

    def read_file(self, sandbox_path: str, max_bytes: int = 1 << 20) -> bytes | None:
        return self.fs.read_file(sandbox_path, max_bytes)

    def probe_exec(self, host_tests_dir: Path, make_cmd: Callable[[str], str], timeout_sec: float) -> ExecResult:
        """Run in a separate bwrap: the sandbox's entries read-only, private /tmp, tests at /tmp/probe-*."""
        copy = self._dir / f"probe-{uuid.uuid4().hex}"
        shutil.copytree(host_tests_dir, copy)
        where = f"/tmp/{copy.name}"
        try:
            extra, env = self._pytest_binds(self.env)
            return self._run(["bash", "-c", make_cmd(where)], cwd=self.workdir, env=env, timeout_sec=timeout_sec,
                             rebuilt_root=True, tmpfs_tmp=True, extra=extra + ["--ro-bind", str(copy), where])
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    def close(self) -> None:
        if self._closed:
            return
        self.stop_processes()
        self._closed = True
        if self.cgroup is not None:
            self.cgroup.destroy()
        if self.net is not None:
            self.net.close()
        disk.release(self._dir)
