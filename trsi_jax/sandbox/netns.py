"""A private network namespace with outbound NAT, for local sandboxes of `allow_internet` tasks.

slirp4netns (user-mode TCP/IP, Debian package slirp4netns) gives the namespace a tap device and NATs
its connections through ordinary sockets of this host; `--disable-host-loopback` refuses the host's
127.0.0.0/8 (10.0.2.2), and abstract unix sockets are per namespace, so the host's loopback services
and abstract sockets (dockerd's included) stay out of reach. DNS: 10.0.2.3 inside.
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess

from trsi_jax.sandbox.base import SandboxError

DNS = "10.0.2.3"
READY_TIMEOUT_SEC = 10.0


class Network:
    """The namespace (held by a sleeping process) and its slirp4netns; commands join it via `enter`."""

    def __init__(self):
        if shutil.which("slirp4netns") is None:
            raise SandboxError("allow_internet on the local backend needs slirp4netns (apt-get install "
                               "slirp4netns), or use backend='docker'")
        self._procs: list[subprocess.Popen] = []
        try:
            # holds the namespace until its stdin (a pipe from this process) closes, i.e. we close or die
            self.holder = self._start(["unshare", "--net", "--", "sh", "-c", "echo ready && read _"], "namespace")
            ns = os.readlink(f"/proc/{self.holder.pid}/ns/net")
            if ns == os.readlink("/proc/self/ns/net"):  # never configure the host's own namespace
                raise SandboxError("the sandbox's network namespace is the host's; not starting slirp4netns")
            self.ns_path = f"/proc/{self.holder.pid}/ns/net"
            r, w = os.pipe()
            try:  # slirp4netns exits when the holder's stdin closes (--exit-fd: the read end of that pipe)
                slirp = subprocess.Popen(
                    ["slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                     "--enable-seccomp", f"--ready-fd={w}", f"--exit-fd={self._exit_r}", str(self.holder.pid),
                     "tap0"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    pass_fds=(w, self._exit_r), start_new_session=True)
                self._procs.append(slirp)
                os.close(w)
                if not select.select([r], [], [], READY_TIMEOUT_SEC)[0] or os.read(r, 1) != b"1":
                    slirp.kill()
                    raise SandboxError(f"slirp4netns did not start: {slirp.stderr.read().decode()[-500:]}")
            finally:
                os.close(r)
        except BaseException:
            self.close()
            raise

    def _start(self, argv: list[str], what: str) -> subprocess.Popen:
        self._exit_r, exit_w = os.pipe()
        p = subprocess.Popen(argv, stdin=self._exit_r, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self._exit_w = os.fdopen(exit_w, "wb")  # closed by close() or by this process's death
        self._procs.append(p)
        if not select.select([p.stdout], [], [], READY_TIMEOUT_SEC)[0] or p.stdout.readline() != b"ready\n":
            raise SandboxError(f"could not create the sandbox's network {what} (exit {p.poll()})")
        return p

    def enter(self) -> list[str]:
        """argv prefix running a command in the namespace."""
        if self.holder.poll() is not None:
            raise SandboxError("the sandbox's network namespace is gone")
        return ["nsenter", f"--net={self.ns_path}", "--"]

    def close(self) -> None:
        for fd in (getattr(self, "_exit_r", None),):
            if fd is not None:
                os.close(fd)
                self._exit_r = None
        if getattr(self, "_exit_w", None) is not None:
            self._exit_w.close()
        for p in reversed(self._procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()
        self._procs = []
