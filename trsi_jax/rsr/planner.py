"""Planner role: turn a verified success into K runbooks, and revise a runbook the critic rejected.

`DeterministicPlanner` derives runbooks from the executed commands and what the terminal
showed (K variants of detail); its revision removes or paraphrases exactly what the critic
flagged. `ModelPlanner` prompts the policy with the public task and the trajectory and parses
its reply in the runbook format; an unparsable reply is recorded as a failure, not retried.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Protocol, Sequence

from trsi_jax.agent.reply import ReplyError, parse_reply
from trsi_jax.rsr.leak_scan import Finding
from trsi_jax.rsr.runbook import Milestone, Runbook, RunbookParseError, parse

_ERROR = re.compile(r"(No such file|not found|[Ee]rror|Traceback|cannot|[Pp]ermission denied|Invalid)")
_READ_ONLY = re.compile(r"^\s*(ls|cat|head|tail|wc|grep|test|\[|stat|find|diff|cmp|file|du|git (status|log|diff))\b")
_PARAPHRASE = {  # verifier paths -> words that keep the sentence readable without the path
    "/tests": "the checks", "/logs/verifier": "the result", "reward.txt": "the result",
    "reward.json": "the result", "test_outputs.py": "the checks", "solve.sh": "a script", "/solution": "a script",
}


@dataclasses.dataclass(frozen=True)
class PlanResult:
    runbook: Runbook | None
    error: str = ""  # why no runbook came out (unparsable planner reply)


class Planner(Protocol):
    def plan(self, items: Sequence[tuple], k: int) -> list[list[PlanResult]]:
        """K runbooks for each (task, episode) success."""

    def revise(self, items: Sequence[tuple]) -> list[PlanResult]:
        """A revised runbook for each (task, episode, runbook, findings, reasons)."""


@dataclasses.dataclass(frozen=True)
class Turn:
    plan: str
    commands: tuple[str, ...]
    observation: str
    waits: tuple[float, ...] = ()  # each command's duration
    confirms: bool = False  # the reply confirmed a completion the agent had already claimed


def episode_turns(messages: Sequence[dict]) -> list[Turn]:
    """(plan, commands, next observation, waits, confirms) for every parsable assistant turn.

    `confirms` follows the common harness: a task_complete reply right after another one is
    the confirmation; an unparsable or unfinished reply, or a verifier's answer to the
    confirmation, makes the next claim a first claim again."""
    turns, pending = [], False
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        try:
            reply = parse_reply(m["content"])
        except ReplyError:
            pending = False
            continue
        confirms = reply.task_complete and pending
        pending = reply.task_complete and not pending
        nxt = messages[i + 1]["content"] if i + 1 < len(messages) and messages[i + 1]["role"] == "user" else ""
        nxt = nxt.split("New terminal output:\n", 1)[-1] if "New terminal output:" in nxt else ""
        sent = [c for c in reply.commands if c.keystrokes.strip()]
        turns.append(Turn(reply.plan.strip(), tuple(c.keystrokes.rstrip("\n") for c in sent), nxt.strip(),
                          tuple(c.duration for c in sent), confirms))
    return turns


def _output_only(turn: Turn) -> str:
    """The observation without the terminal's echo of the turn's own commands."""
    echoed = {line.strip() for c in turn.commands for line in c.splitlines() if line.strip()}
    return "\n".join(ln for ln in turn.observation.splitlines()
                     if not any(e in ln for e in echoed))


def _excerpt(text: str, limit: int = 160) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("$", "#", ">"))]
    out = " | ".join(lines[:3])
    return out if len(out) <= limit else out[:limit - 3] + "..."


def derive_runbook(task, messages: Sequence[dict], variant: int = 0) -> Runbook:
    """A runbook from what the agent did: every command in order as a milestone (with the wait
    the agent gave it), read-only commands also as checks, failed commands as pitfalls with the
    command that followed as the recovery. Commands sent with a confirmation are left out: by the
    agent's own word the work was done before it (a replay that needed them fails verification
    and yields no data). `variant` varies the detail (observations, checks) so K runbooks differ."""
    turns = [t for t in episode_turns(messages) if not t.confirms]
    milestones, checks, recovery, pitfalls = [], [], [], []
    with_observed = variant % 2 == 0
    flat = [(t, c, w) for t in turns for c, w in zip(t.commands, t.waits)]
    for idx, (turn, cmd, wait) in enumerate(flat):
        failed = bool(_ERROR.search(_output_only(turn))) and cmd == turn.commands[-1]
        desc = turn.plan if turn.plan and variant < 2 else f"Run `{cmd.splitlines()[0][:80]}`"
        observed = _excerpt(turn.observation) if with_observed and cmd == turn.commands[-1] else ""
        if failed:
            err = _excerpt(turn.observation, 100)
            pitfalls.append(f"`{cmd.splitlines()[0][:80]}` failed: {err}")
            if idx + 1 < len(flat):
                recovery.append(f"If it fails with '{err}', continue with `{flat[idx + 1][1].splitlines()[0][:80]}`")
            continue
        milestones.append(Milestone(desc, cmd, observed, wait))
        if _READ_ONLY.match(cmd) and variant != 3:
            checks.append(f"`{cmd.splitlines()[0][:80]}` shows the expected state")
    target = " ".join(task.instruction.split())
    return Runbook(target, tuple(milestones), tuple(dict.fromkeys(checks)), tuple(recovery), tuple(pitfalls))


def _scrub(text: str, spans: Sequence[str]) -> str | None:
    """`text` with flagged verifier paths paraphrased; None when it still holds a flagged span."""
    for span in spans:
        if span in _PARAPHRASE and span in text:
            text = text.replace(span, _PARAPHRASE[span])
    return None if any(s in text for s in spans) else text


def revise_runbook(rb: Runbook, findings: Sequence[Finding]) -> Runbook:
    """Removes every field holding a flagged span (a milestone whose command holds one is
    dropped whole) and paraphrases flagged verifier paths in prose."""
    spans = [f.span for f in findings]
    milestones = []
    for m in rb.milestones:
        if m.command and _scrub(m.command, spans) != m.command:
            continue  # the command itself is flagged (paraphrasing a command would change it)
        desc = _scrub(m.description, spans) or "Continue"
        milestones.append(dataclasses.replace(m, description=desc, observed=_scrub(m.observed, spans) or ""))

    def keep(items):
        return tuple(x for x in (_scrub(t, spans) for t in items) if x)

    target = _scrub(rb.target, spans) or "Reach the end state the task asks for."
    return Runbook(target, tuple(milestones), keep(rb.checks), keep(rb.recovery), keep(rb.pitfalls))


class DeterministicPlanner:
    """Rule-based planner (tiny default and tests)."""

    def plan(self, items, k):
        out = []
        for task, episode in items:
            seen, results = set(), []
            for v in range(k):
                rb = derive_runbook(task, episode.messages, v)
                if rb.milestones and rb.render() not in seen:
                    seen.add(rb.render())
                    results.append(PlanResult(rb))
            out.append(results or [PlanResult(None, "the success has no parsable commands")])
        return out

    def revise(self, items):
        return [PlanResult(revise_runbook(rb, findings)) for _task, _ep, rb, findings, _reasons in items]


PLAN_PROMPT = """\
You solved the terminal task below. Write a runbook that would let an agent reach the same end
state from the task alone. Never quote or mention test files, verifier paths or expected test
outputs. Use exactly this format:
RUNBOOK
Target end state: <one line>
Milestones:
1. <what to achieve>
   $ <command>
   -> <what the terminal should show>
Checks:
- <how to confirm progress>
Recovery:
- <what to do if a step fails>
Pitfalls:
- <mistakes to avoid>

Task:
{instruction}

What you did (commands and terminal output):
{transcript}"""

REVISE_PROMPT = """\
A reviewer rejected your runbook for the task below. Reasons:
{reasons}
Rewrite the runbook so none of these problems remain, in the same format (starting with RUNBOOK).

Task:
{instruction}

Rejected runbook:
{runbook}"""


def transcript(messages: Sequence[dict], max_chars: int = 6000) -> str:
    parts = []
    for t in episode_turns(messages):
        for c in t.commands:
            parts.append(f"$ {c}")
        if t.observation:
            parts.append(t.observation[-800:])
    text = "\n".join(parts)
    return text if len(text) <= max_chars else text[-max_chars:]


class ModelPlanner:
    """The policy as planner: one batched `act` call per round of prompts."""

    def __init__(self, policy):
        self.policy = policy

    def _ask(self, prompts: list[str]) -> list[PlanResult]:
        replies = self.policy.act([[{"role": "user", "content": p}] for p in prompts])
        out = []
        for r in replies:
            try:
                out.append(PlanResult(parse(r.text)))
            except RunbookParseError as e:
                out.append(PlanResult(None, f"planner reply unparsable: {e}"))
        return out

    def plan(self, items, k):
        prompts = [PLAN_PROMPT.format(instruction=task.instruction.strip(), transcript=transcript(ep.messages))
                   for task, ep in items for _ in range(k)]
        flat = self._ask(prompts)
        return [flat[i * k:(i + 1) * k] for i in range(len(items))]

    def revise(self, items):
        prompts = [REVISE_PROMPT.format(instruction=task.instruction.strip(), runbook=rb.render(),
                                        reasons="\n".join(f"- {r}" for r in reasons))
                   for task, _ep, rb, _findings, reasons in items]
        return self._ask(prompts)
