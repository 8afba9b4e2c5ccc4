"""The oracle: run a task's reference solution in a fresh sandbox, then verify. A task whose oracle
fails is broken (or its environment is), which is what loaders and suite builders check with it."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from trsi_jax.sandbox.base import Limits
from trsi_jax.sandbox.verifier import VerifyResult, verify
from trsi_jax.tasks import Task, TaskError

SOLUTION_PATH = "/solution"


def run_solution(sandbox, task: Task) -> str:
    """Play the reference solution into `sandbox` (like an agent would); returns its output."""
    if task.solution_path is None:
        raise TaskError(f"{task.path}: no solution (solution/solve.sh, solution.sh or solution.yaml)")
    if task.solution_steps:  # TB1 solution.yaml: keystrokes into the terminal
        term = sandbox.terminal()
        for step in task.solution_steps:
            keys = step.command + ("\n" if step.append_enter and not step.command.endswith("\n") else "")
            budget = task.agent_timeout_sec if step.block else max(step.min_timeout_sec, 0.5)
            start = time.monotonic()
            term.send_keys(keys, duration_sec=budget)
            rest = step.min_timeout_sec - (time.monotonic() - start)
            if rest > 0:
                time.sleep(rest)
        return term.read_new_output()
    with tempfile.TemporaryDirectory() as tmp:  # TB2: the whole solution/ folder; TB1: solution.sh
        if task.fmt == "tb2":
            shutil.copytree(task.solution_path.parent, tmp, dirs_exist_ok=True)
        else:
            shutil.copy(task.solution_path, Path(tmp) / task.solution_path.name)
        sandbox.put_dir(Path(tmp), SOLUTION_PATH)
    res = sandbox.exec(f"bash {SOLUTION_PATH}/{task.solution_path.name}", timeout_sec=task.agent_timeout_sec)
    return res.output


def run_oracle(task: Task, backend: str = "local", limits: Limits | None = None) -> VerifyResult:
    """Fresh sandbox, reference solution, verification."""
    from trsi_jax.sandbox import make_sandbox
    with make_sandbox(task, backend, limits) as sb:
        run_solution(sb, task)
        return verify(sb, task)
