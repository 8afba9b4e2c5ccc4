"""The sandbox interface every backend implements, its result records and resource limits.

A sandbox is one fresh machine per episode: the agent works in it through `exec` and `terminal`;
afterwards the verifier (see verifier.py) stops every process the agent left, places the tests and
runs them. Backends: local.py (bubblewrap) and docker.py (Docker engine).
"""
from __future__ import annotations

import abc
import collections
import dataclasses
import os
import threading
from pathlib import Path
from typing import IO, Callable, Iterable

from trsi_jax.tasks import Task

TESTS_PATH = "/tests"
VERIFIER_LOGS = "/logs/verifier"
DEFAULT_EXEC_TIMEOUT_SEC = 60.0
BUILD_TIMEOUT_SEC = 600.0


class SandboxError(RuntimeError):
    """The sandbox could not be built or died mid-episode; callers mark the episode failed."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-sandbox resource limits (enforced per process by rlimits, per sandbox by cgroups)."""
    cpu_sec: int = 900  # RLIMIT_CPU of every process
    memory_mb: int = 2048  # cgroup memory (docker: --memory); RLIMIT_AS where no cgroup exists
    pids: int = 256  # processes+threads alive at once in the whole sandbox
    file_size_mb: int = 512  # RLIMIT_FSIZE: the largest file a process may write
    disk_mb: int = 8192  # local: bytes the whole sandbox may store (its own file system; 0: no quota)
    inodes: int = 262144  # local: files, directories and links the sandbox may hold
    output_bytes: int = 64 * 1024  # exec output kept (head + tail, middle dropped with a marker)
    nofile: int = 1024
    cpus: float = 1.0  # docker only (nano_cpus)
    # docker only: the verifier's container gets the network (bridge), as harbor gives test scripts
    # that download their tooling; the agent's container keeps the task's `allow_internet`. Off by
    # default: the offline toolchain stands in, and code of the agent's that the tests run stays offline.
    # Not where the agent left servers running: the verifier then shares the agent's network (services.py).
    verifier_network: bool = False

    @classmethod
    def for_task(cls, task: Task, **overrides) -> "Limits":
        budget = int(task.agent_timeout_sec + task.verifier_timeout_sec) + 60
        # A task may ask for more CPUs than this machine has (docker refuses those): cap at the host's.
        cpus = min(task.environment.cpus, float(os.cpu_count() or 1))
        base = dict(cpu_sec=budget, memory_mb=task.environment.memory_mb, cpus=cpus)
        return cls(**{**base, **overrides})


@dataclasses.dataclass(frozen=True)
class ExecResult:
    exit_code: int  # -1 when the command was killed on timeout
    output: str  # stdout and stderr interleaved, capped at Limits.output_bytes
    timed_out: bool
    truncated: bool = False


def cap_text(data: bytes, max_bytes: int, dropped: int = 0) -> tuple[str, bool]:
    """Decode `data` keeping at most max_bytes: head and tail around a marker saying what was cut."""
    if len(data) <= max_bytes and not dropped:
        return data.decode("utf-8", "replace"), False
    half = max_bytes // 2
    head, tail = data[:half], data[-half:] if len(data) > half else b""
    cut = dropped + max(0, len(data) - len(head) - len(tail))
    marker = f"\n[... {cut} bytes of output omitted ...]\n".encode()
    return (head + marker + tail).decode("utf-8", "replace"), True


class OutputCollector:
    """Drains byte chunks in a thread, keeping the first and last max_bytes/2 bytes and counting the rest."""

    def __init__(self, chunks: Iterable[bytes], max_bytes: int):
        self._half = max(1, max_bytes // 2)
        self._max = max_bytes
        self._head = bytearray()
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_len = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._drain, args=(chunks,), daemon=True)
        self._thread.start()

    @classmethod
    def from_stream(cls, stream: IO[bytes], max_bytes: int) -> "OutputCollector":
        return cls(iter(lambda: stream.read1(65536), b""), max_bytes)

    def _drain(self, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            if len(self._head) < self._half:
                take = self._half - len(self._head)
                self._head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                self._tail.append(chunk)
                self._tail_len += len(chunk)
                while self._tail_len - len(self._tail[0]) >= self._half:
                    self._tail_len -= len(self._tail[0])
                    self.dropped += len(self._tail.popleft())

    def result(self, join_timeout: float = 5.0) -> tuple[str, bool]:
        self._thread.join(join_timeout)
        tail = b"".join(self._tail)
        if len(tail) > self._half:
            self.dropped += len(tail) - self._half
            tail = tail[-self._half:]
        if not self.dropped:
            return cap_text(bytes(self._head) + tail, self._max)
        return cap_text(bytes(self._head) + tail, len(self._head) + len(tail), self.dropped)


class Sandbox(abc.ABC):
    """One fresh machine for one episode; use as a context manager so it is always torn down."""

    task: Task
    limits: Limits
    workdir: str

    @abc.abstractmethod
    def exec(self, cmd: str, timeout_sec: float = DEFAULT_EXEC_TIMEOUT_SEC, *, env: dict[str, str] | None = None,
             with_pytest: bool = False) -> ExecResult:
        """Run `cmd` with bash in the workdir. `with_pytest` makes it a verifier run: the verifier
        toolchain (toolchain.py) at /.trsi with its shims first on PATH, on a root the agent's
        loader/python configuration cannot reach; only used after the agent has finished."""

    @abc.abstractmethod
    def terminal(self):
        """The episode's tmux terminal (created on first call), a `terminal.Terminal`."""

    @abc.abstractmethod
    def stop_processes(self) -> None:
        """Kill every process in the sandbox (the agent is done); files stay."""

    @abc.abstractmethod
    def put_dir(self, host_dir: Path | None, sandbox_path: str) -> None:
        """Replace `sandbox_path` by a fresh directory holding a copy of host_dir (empty if None)."""

    @abc.abstractmethod
    def read_file(self, sandbox_path: str, max_bytes: int = 1 << 20) -> bytes | None:
        """Bytes of a regular file in the sandbox (None if absent or not a regular file)."""

    @abc.abstractmethod
    def probe_exec(self, host_tests_dir: Path, make_cmd: Callable[[str], str], timeout_sec: float) -> ExecResult:
        """Run make_cmd(path) where `path` holds a copy of host_tests_dir, out of the agent's view,
        without disturbing the agent's processes (mid-episode progress checks)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Tear the sandbox down (idempotent)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
