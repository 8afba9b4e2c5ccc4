"""Per-sandbox cgroups: a pids cap (what really stops a fork bomb when the sandbox runs as root,
since RLIMIT_NPROC does not apply to uid 0) and a memory cap. cgroup v1 (a child of this process's
own cgroup per controller) or v2 (a child of this process's own unified cgroup, when delegated)."""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """controller name ('' for the v2 unified hierarchy) -> this process's cgroup path."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            out[c] = path
    return out


def owner_alive(pid_text: str) -> bool:
    """Whether the process named in a `trsi-<pid>-...` resource name still runs (names without a pid
    count as alive: nothing can tell)."""
    if not pid_text.isdigit():
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Cgroup:
    """Child cgroups (one per available controller) that sandbox processes join via `procs_files`."""

    def __init__(self, dirs: list[Path]):
        self.dirs = dirs

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(cls, pids_max: int, memory_bytes: int) -> "Cgroup | None":
        """A fresh cgroup capping pids and memory, or None where this machine offers no writable cgroups."""
        own = _own_paths()
        made: list[Path] = []
        name = f"trsi-{os.getpid()}-{uuid.uuid4().hex[:12]}"  # owner pid: see sweep_stale
        try:
            if (_ROOT / "pids").is_dir() and "pids" in own:
                d = _ROOT / "pids" / own["pids"].lstrip("/") / name
                d.mkdir()
                made.append(d)
                (d / "pids.max").write_text(str(pids_max))
                if "memory" in own and (_ROOT / "memory").is_dir():
                    d = _ROOT / "memory" / own["memory"].lstrip("/") / name
                    d.mkdir()
                    made.append(d)
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    if (d / "memory.memsw.limit_in_bytes").exists():  # no escaping the cap into swap
                        (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            elif "" in own and (_ROOT / "cgroup.controllers").is_file():
                d = _ROOT / own[""].lstrip("/") / name
                d.mkdir()
                made.append(d)
                (d / "pids.max").write_text(str(pids_max))
                (d / "memory.max").write_text(str(memory_bytes))
                (d / "memory.swap.max").write_text("0")
            else:
                return None
        except OSError:
            cls(made).destroy()
            return None
        return cls(made)

    @classmethod
    def sweep_stale(cls) -> None:
        """Remove sandbox cgroups whose owning process died without closing them (e.g. SIGKILL)."""
        for ctrl, path in _own_paths().items():
            parent = _ROOT / (ctrl or "") / path.lstrip("/") if ctrl in ("pids", "memory", "") else None
            if parent is None or not parent.is_dir():
                continue
            stale = [d for d in parent.glob("trsi-*-*") if not owner_alive(d.name.split("-")[1])]
            if stale:
                cls(stale).destroy()

    def pids(self) -> list[int]:
        out = set()
        for f in self.procs_files:
            try:
                out.update(int(x) for x in Path(f).read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def kill_all(self, deadline_sec: float = 5.0) -> None:
        """SIGKILL every member until none is left (a fork bomb cannot outgrow its pids cap)."""
        end = time.monotonic() + deadline_sec
        while (pids := self.pids()) and time.monotonic() < end:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)

    def destroy(self) -> None:
        self.kill_all()
        for d in reversed(self.dirs):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # members still exiting
                    time.sleep(0.01)
