"""The escape suite: one real attack per class, on both backends, each asserting the exact outcome
(host file untouched, no host-side execution, host services unreachable, quota hit, reward not forged).

Sections: host side and containment (terminal, host file operations, network, capabilities, quota,
what /proc shows); verifier integrity (what the verifier runs with and what it trusts).
"""
import os
import shutil
import socket
import subprocess
import threading
import uuid

import pytest

from tests.sandbox_tasks import write_tb2
from trsi_jax.sandbox import SandboxError, make_sandbox
from trsi_jax.tasks import load_task


def _docker_ok() -> bool:
    try:
        import docker
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get("trsi/debian:bookworm")
        return True
    except Exception:  # noqa: BLE001 (any failure means: no docker here)
        return False


_LOCAL_OK = shutil.which("bwrap") is not None and shutil.which("tmux") is not None
BACKENDS = [pytest.param("local", marks=pytest.mark.skipif(not _LOCAL_OK, reason="needs bubblewrap and tmux")),
            pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.skipif(
                not _docker_ok(), reason="needs dockerd and trsi/debian:bookworm")])]


def _task(tmp_path, dockerfile_extra: str = "", toml_extra: str = ""):
    dockerfile = "FROM debian:bookworm\nWORKDIR /app\n" + dockerfile_extra
    return load_task(write_tb2(tmp_path, f"t-{uuid.uuid4().hex[:6]}", dockerfile=dockerfile, toml_extra=toml_extra))


def _victim(tmp_path) -> tuple[str, bytes]:
    """A host file the attacks aim at, and its content."""
    p = tmp_path / "host-victim.txt"
    p.write_bytes(b"host-owned content\n")
    return str(p), p.read_bytes()


def _keys(term, keys: str, wait: float = 5.0) -> None:
    """Type into the terminal; a SandboxError (terminal gone) is an acceptable outcome of an attack."""
    try:
        term.send_keys(keys, wait)
    except SandboxError:
        pass


# ==== host side and containment ======================================================================

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("attack", [
    "rm -f /run/trsi/tmux.sock; exit",
    "tmux -S /run/trsi/tmux.sock kill-server",
    "tmux -S /tmp/evil.sock -f /dev/null new-session -d -s evil 'sleep 100'; mv -f /tmp/evil.sock /run/trsi/tmux.sock"])
def test_replaced_tmux_server_runs_nothing_on_the_host(tmp_path, backend, attack):
    """The agent removes or replaces its tmux server's socket; keys typed next must not run on the host
    (a host tmux client would start a host server, or obey the agent's one, and run them there)."""
    marker = tmp_path / "ran-on-host"
    with make_sandbox(_task(tmp_path), backend) as sb:
        term = sb.terminal()
        _keys(term, attack + "\n", 2)
        for _ in range(2):
            _keys(term, f"touch {marker}\n")
            try:
                term.read_new_output()
            except SandboxError:
                pass
    assert not marker.exists()


@pytest.mark.parametrize("backend", BACKENDS)
def test_socket_pointed_at_a_host_tmux_server(tmp_path, backend):
    """The agent links its socket path to a tmux server of the host and exits its shell: the fresh shell
    the harness then asks for, and the keys typed into it, must not reach that server."""
    host_sock, marker = tmp_path / "host-tmux.sock", tmp_path / "ran-on-host"
    subprocess.run(["tmux", "-S", str(host_sock), "-f", "/dev/null", "new-session", "-d", "-s", "h", "cat"],
                   check=True)
    try:
        with make_sandbox(_task(tmp_path), backend) as sb:
            term = sb.terminal()
            _keys(term, f"ln -sf {host_sock} /tmp/l && mv -f /tmp/l /run/trsi/tmux.sock; exit\n", 2)
            _keys(term, f"touch {marker}\n")
        sessions = subprocess.run(["tmux", "-S", str(host_sock), "list-sessions", "-F", "#S"],
                                  capture_output=True, text=True, check=True).stdout.split()
        assert sessions == ["h"] and not marker.exists()
    finally:
        subprocess.run(["tmux", "-S", str(host_sock), "kill-server"], capture_output=True)


@pytest.mark.slow  # docker builds an image with the planted links (~60 s on a loaded 2-core machine)
@pytest.mark.parametrize("backend", BACKENDS)
def test_planted_links_never_lead_host_file_operations_out(tmp_path, backend):
    """Links planted by a Dockerfile RUN and by the agent at the paths the host writes or reads (terminal
    config and counter, the verifier's /logs, a result file) leave the host's files untouched."""
    victim, content = _victim(tmp_path)
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "secret").write_text("host secret\n")
    run = (f"RUN mkdir -p /run/trsi /srv && ln -s {victim} /run/trsi/tmux.conf && ln -s {victim} /run/trsi/prompt"
           f" && ln -sfn {host_dir} /srv/hostdir\nCOPY data.txt /srv/hostdir/\n")
    task = _task(tmp_path, run)
    with make_sandbox(task, backend) as sb:
        term = sb.terminal()
        _keys(term, "echo typed\n")
        _keys(term, f"rm -rf /logs; ln -s {host_dir} /logs; ln -s {host_dir} /app/res; "
                    f"ln -s {victim} /app/out.txt\n")
        # /etc swapped for a link to the host (as bwrap sees it while it sets up mounts: /oldroot)
        _keys(term, f"mv /etc /etc.old; ln -s /oldroot{host_dir} /etc || ln -s /oldroot{host_dir} /etc/alternatives\n")
        sb.exec("true")
        assert sb.read_file("/app/out.txt") is None
        assert sb.read_file("/app/res/secret") is None
        sb.stop_processes()
        sb.put_dir(None, "/logs/verifier")
        assert sb.read_file("/app/res/secret") is None
    assert open(victim, "rb").read() == content
    assert sorted(os.listdir(host_dir)) == ["secret"]


# Bounding set both backends keep: chown dac_override fowner fsetid kill setgid setuid net_bind_service.
CAP_MASK = "00000000000404fb"


@pytest.mark.parametrize("backend", BACKENDS)
def test_capability_bounding_set_is_cut(tmp_path, backend):
    """Commands and the terminal's shell hold only the small capability set, bounding set included, with
    no_new_privs: no program (file capabilities, setuid) can raise them."""
    with make_sandbox(_task(tmp_path), backend) as sb:
        show = "grep -E '^(CapPrm|CapEff|CapBnd|NoNewPrivs)' /proc/self/status | tr -s '\\t ' ' '"
        r = sb.exec(show + " > /tmp/caps; cat /tmp/caps")
        want = [f"CapPrm: {CAP_MASK}", f"CapEff: {CAP_MASK}", f"CapBnd: {CAP_MASK}", "NoNewPrivs: 1"]
        assert r.output.split("\n")[:4] == want
        term = sb.terminal()
        term.send_keys(show + " > /tmp/term-caps\n", 5)
        assert sb.read_file("/tmp/term-caps").decode().split("\n")[:4] == want
        # a binary given every file capability still runs with the small set (setcap itself is refused)
        r = sb.exec("cp /bin/cat /tmp/c && (setcap all+ep /tmp/c 2>/dev/null; /tmp/c /proc/self/status) | grep CapEff")
        assert r.output.split() == ["CapEff:", CAP_MASK]


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_user_namespaces_or_bpf(tmp_path, backend):
    """The kernel interfaces container escapes go through are refused: a user namespace (where the agent
    would hold every capability again) and bpf; ordinary process creation still works."""
    with make_sandbox(_task(tmp_path), backend) as sb:
        r = sb.exec("unshare -U true 2>/dev/null; echo $?; unshare -Ur true 2>/dev/null; echo $?; "
                    "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                    "print(l.syscall(321, 0, 0, 0), ctypes.get_errno())'; (sleep 0.1 & wait) && echo forks")
        assert r.output.split() == ["1", "1", "-1", "1", "forks"]  # bpf: EPERM


@pytest.mark.parametrize("backend", BACKENDS)
def test_proc_shows_no_host_paths(tmp_path, backend):
    """/proc/1/cmdline and the mount table name no host path of the sandbox or the task."""
    with make_sandbox(_task(tmp_path), backend) as sb:
        r = sb.exec("tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/self/mountinfo")
        assert r.exit_code == 0 and "/proc" in r.output
        for host_path in [str(tmp_path)] + ([str(sb.root), str(sb.root.parent)] if backend == "local" else []):
            assert host_path not in r.output


def _host_ip() -> str:
    """An address of this host other than loopback (what outbound NAT can reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


class _Listener:
    """A TCP listener (or an abstract unix socket) on the host that records whether anyone connected."""

    def __init__(self, family, address):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.address = self.sock.getsockname()
        self.connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        try:
            while True:
                c, _ = self.sock.accept()
                self.connected.set()
                c.close()
        except OSError:
            pass

    def close(self):
        self.sock.close()


TRY_TCP = "timeout 5 bash -c 'echo hi > /dev/tcp/{}/{}' 2>/dev/null && echo open || echo closed"
TRY_ABSTRACT = ("python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.settimeout(5); "
                "s.connect('\\0{}'); print('open')\" 2>/dev/null || echo closed")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("internet", [True, False])
def test_network_never_reaches_host_loopback_or_abstract_sockets(tmp_path, backend, internet):
    """With allow_internet, outbound connections work (NAT: the host's own non-loopback address answers)
    but the host's 127.0.0.1 services and abstract unix sockets are unreachable; without it, nothing is."""
    loop = _Listener(socket.AF_INET, ("127.0.0.1", 0))
    outside = _Listener(socket.AF_INET, (_host_ip(), 0))
    name = f"trsi-escape-{uuid.uuid4().hex[:8]}"
    abstract = _Listener(socket.AF_UNIX, "\0" + name)
    try:
        task = _task(tmp_path, toml_extra=f"allow_internet = {'true' if internet else 'false'}\n")
        with make_sandbox(task, backend) as sb:
            probes = [TRY_TCP.format(*outside.address), TRY_TCP.format("127.0.0.1", loop.address[1]),
                      TRY_TCP.format("10.0.2.2", loop.address[1]), TRY_ABSTRACT.format(name)]
            r = sb.exec("; ".join(probes), timeout_sec=60)
            assert r.output.split() == ["open" if internet else "closed", "closed", "closed", "closed"], r.output
            term = sb.terminal()  # the terminal's shell lives in the same network
            term.send_keys("{ " + "; ".join(probes) + "; } > /tmp/net.txt\n", 30)
            assert sb.read_file("/tmp/net.txt").decode().split() == r.output.split()
        assert outside.connected.is_set() == internet
        assert not loop.connected.is_set() and not abstract.connected.is_set()
    finally:
        for listener in (loop, outside, abstract):
            listener.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_disk_and_inode_quota(tmp_path, backend):
    """Filling the disk (or, on local, the inode table) stops at the sandbox's quota with ENOSPC, and the
    host holds no more than the quota for it."""
    from trsi_jax.sandbox import Limits
    task = _task(tmp_path)
    limits = Limits.for_task(task, disk_mb=64, inodes=4096)
    if backend == "docker":
        import docker
        from trsi_jax.sandbox.docker import enforces_disk_quota
        if not enforces_disk_quota(docker.from_env()):
            pytest.skip("docker: this storage driver enforces no per-container size (overlay2 needs XFS with "
                        "pquota, or use the btrfs/zfs driver)")
    else:
        from trsi_jax.sandbox import disk
        if not disk.available():
            pytest.skip("no loop devices / mkfs.ext4: the local backend runs without a disk quota here")
    with make_sandbox(task, backend, limits) as sb:
        r = sb.exec("dd if=/dev/zero of=/app/big bs=1M count=200 2>&1 | head -1; rm /app/big", timeout_sec=120)
        # ENOSPC on local's own file system; EDQUOT from docker's btrfs qgroup
        assert r.output.splitlines()[0] in ("dd: error writing '/app/big': No space left on device",
                                            "dd: error writing '/app/big': Disk quota exceeded"), r.output
        if backend == "local":
            r = sb.exec("mkdir /tmp/many && cd /tmp/many && for i in $(seq 5000); do : > f$i || break; done 2>&1 "
                        "| head -1; ls | wc -l", timeout_sec=120)
            lines = r.output.splitlines()
            assert "No space left on device" in lines[0] and 3900 < int(lines[1]) < 4096
            used = sum(os.lstat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(sb.root.parent)
                       for f in fs if not d.startswith(str(sb.root)))
            assert used <= 64 << 20  # the image file: what the sandbox wrote is all the host holds


# ==== verifier integrity =============================================================================
