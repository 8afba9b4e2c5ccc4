"""Privileged harnesses: the common loop plus help the test-time harness does not give.

Used only to collect successes for RSR (their trajectories are rewritten before training).
None of them shows test code: progress comes from `probe_progress`, which runs the task's
progress tests outside the agent's view, and hints come from the oracle's first step and the
names of the progress checks.
"""
from __future__ import annotations

import os
import re
import shlex

from trsi_jax.agent.harness import CommonHarness, Session, record_progress


class VerifierFeedbackHarness(CommonHarness):
    """After every turn, shows how much of the progress checks currently pass."""

    name = "verifier_feedback"

    def after_turn(self, session: Session) -> str:
        p = record_progress(session)
        if p is None:  # the probe could not measure it this turn
            return "Verifier feedback: not available this turn."
        return f"Verifier feedback: {p:.0%} of the progress checks pass."


class RetryHarness(CommonHarness):
    """On confirmed completion, checks progress; if not all checks pass, gives extra turns and a retry."""

    name = "retry"

    def __init__(self, max_retries: int = 1, extra_turns: int = 10, **kw):
        super().__init__(**kw)
        self.max_retries = max_retries
        self.extra_turns = extra_turns

    def on_complete(self, session: Session) -> str | None:
        p = record_progress(session)
        if p is None or p >= 1.0 or session.retries >= self.max_retries:  # None: unmeasured, no retry
            return None
        session.retries += 1
        session.max_turns += self.extra_turns
        return (f"Verification failed: only {p:.0%} of the checks pass. The task is not done. "
                f"You have {self.extra_turns} more turns; find what is missing and fix it.")


def first_oracle_step(task) -> str | None:
    """The first real command of the reference solution (skipping shebang, comments, `set -...`,
    `cd`), whole: a command whose quotes or trailing backslashes span lines (an inline Python
    script) is read to its end."""
    if getattr(task, "solution_steps", ()):  # TB1 solution.yaml
        return task.solution_steps[0].command.strip() or None
    path = getattr(task, "solution_path", None)
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        line = line.strip()
        if line and not line.startswith("#") and not re.match(r"(set\s+-|cd(\s+\S+)?$)", line):
            return _whole_command(lines, i)
    return None


def _whole_command(lines: list[str], start: int) -> str:
    """Lines from `start` until the shell command they begin is complete (balanced quotes, no
    trailing backslash); the first line alone when it never completes."""
    for end in range(start, len(lines)):
        text = "\n".join(lines[start:end + 1]).strip()
        if text.endswith("\\"):
            continue
        try:
            shlex.split(text, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        return text
    return lines[start].strip()


def milestone_names(progress_tests) -> list[str]:
    """`tests/test_outputs.py::test_sorted_output_exists` -> `sorted output exists`."""
    names = []
    for t in progress_tests or ():
        name = str(t).split("::")[-1]
        name = re.sub(r"^test_", "", name).replace("_", " ").strip()
        if name:
            names.append(name)
    return names


class HintHarness(CommonHarness):
    """Adds a hint to the task: the oracle's first step and the milestones to reach."""

    name = "hint"

    def task_message(self, task) -> str:
        lines = [super().task_message(task), "", "Hints:"]
        step = first_oracle_step(task)
        if step:
            lines.append(f"- A good first step: {step}")
        milestones = milestone_names(getattr(task, "progress_tests", ()))
        if milestones:
            lines.append("- Milestones: " + "; ".join(milestones))
        if len(lines) == 3:
            lines.append("- Work step by step and check each result before moving on.")
        return "\n".join(lines)


HARNESSES = {
    "common": CommonHarness,
    "verifier_feedback": VerifierFeedbackHarness,
    "retry": RetryHarness,
    "hint": HintHarness,
}


def make_harness(name: str, **kw) -> CommonHarness:
    if name not in HARNESSES:
        raise ValueError(f"unknown harness {name!r}; choose one of {sorted(HARNESSES)}")
    return HARNESSES[name](**kw)
