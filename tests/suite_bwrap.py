"""Test-only runner for suite tasks: interprets a task's Dockerfile in a bubblewrap sandbox with the task's workdir
at /app, optionally runs the oracle, then the verifier (tests copied in only then). Stands in for
trsi_jax.sandbox.run_oracle until that backend exists."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile


def _bwrap(binds: dict[str, str], env: dict[str, str], cmd: str, timeout: int = 60) -> subprocess.CompletedProcess:
    args = ["bwrap"]
    for top in sorted(os.listdir("/")):
        if top not in ("proc", "dev", "tmp", "sys", "app", "tests", "logs", "solution"):
            args += ["--ro-bind", "/" + top, "/" + top]
    args += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-all", "--die-with-parent",
             "--clearenv", "--chdir", "/app"]
    for dst, src in binds.items():
        args += ["--bind", src, dst]
    for k, v in env.items():
        args += ["--setenv", k, v]
    return subprocess.run(args + ["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout)


def run_task(task_dir: str, oracle: bool) -> tuple[bool, dict[str, bool], str]:
    """Build the environment, run the oracle if asked, verify. Returns (reward == 1, {test: passed}, log)."""
    tmp = tempfile.mkdtemp(prefix="suite-run-")
    try:
        work, logs = os.path.join(tmp, "app"), os.path.join(tmp, "logs")
        os.makedirs(work), os.makedirs(logs)
        env = {"PATH": os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
               "LANG": "C.UTF-8"}
        binds = {"/app": work, "/logs": logs}
        log = []
        for line in open(os.path.join(task_dir, "environment", "Dockerfile")).read().splitlines():
            op, _, arg = line.partition(" ")
            if op == "ENV":
                k, _, v = arg.partition("=")
                env[k] = shlex.split(v)[0]
            elif op == "COPY":
                src, dst = arg.split()
                assert dst.rstrip("/") == "/app", line
                shutil.copytree(os.path.join(task_dir, "environment", src), work, dirs_exist_ok=True)
            elif op == "RUN":
                r = _bwrap(binds, env, arg)
                assert r.returncode == 0, f"{task_dir}: RUN failed: {arg}\n{r.stdout}{r.stderr}"
            else:
                assert op in ("FROM", "WORKDIR"), line
        if oracle:
            r = _bwrap({**binds, "/solution": os.path.join(task_dir, "solution")}, env, "bash /solution/solve.sh")
            log.append(r.stdout + r.stderr)
            assert r.returncode == 0, f"{task_dir}: solve.sh failed:\n{r.stdout}{r.stderr}"
        tests = os.path.join(tmp, "tests")
        shutil.copytree(os.path.join(task_dir, "tests"), tests)
        r = _bwrap({**binds, "/tests": tests}, env, "bash /tests/test.sh")
        log.append(r.stdout + r.stderr)
        results = {m.group(2): m.group(1) == "PASSED"
                   for m in re.finditer(r"^(PASSED|FAILED|ERROR) \S+::(\w+)", r.stdout, re.M)}
        reward = open(os.path.join(logs, "verifier", "reward.txt")).read().strip()
        return reward == "1", results, "\n".join(log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
