"""Executor role: replay accepted runbooks under the common harness, M times each.

`run_episodes` gives every replay its own fresh sandbox and shows the rendered runbook as
context that is absent from the recorded messages and tokens. The model executor samples the policy
(paper: temperature 0.7) as a `ModelPolicy`; the deterministic executor is a `ScriptedPolicy` that reads the runbook
from its context and sends one milestone command per turn (or, as "deterministic_one_reply", every
command in its first reply), each with the runbook's wait, then confirms completion.
"""
from __future__ import annotations

from typing import Sequence

from trsi_jax.agent import CommonHarness, format_reply
from trsi_jax.rollout import Budgets, Episode, ScriptedPolicy, run_episodes
from trsi_jax.rsr.runbook import HEADER, RunbookParseError, parse


def _runbook_in(conversation: list[dict]):
    for m in conversation:
        if m["role"] == "user" and m["content"].lstrip().startswith(HEADER):
            return parse(m["content"])
    raise RunbookParseError("the deterministic executor found no runbook in its context")


def follow_runbook(conversation: list[dict]) -> str:
    """The reply after `conversation`: the next milestone's command, then task_complete twice."""
    rb = _runbook_in(conversation)
    steps = [m for m in rb.milestones if m.command]
    done = sum(m["role"] == "assistant" for m in conversation)
    if done < len(steps):
        step = steps[done]
        return format_reply([(step.command + "\n", step.wait)], analysis=f"Milestone {done + 1} of {len(steps)}.",
                            plan=step.description)
    return format_reply([], task_complete=True, analysis="Every milestone is done.", plan="Finish.")


def follow_runbook_in_one_reply(conversation: list[dict]) -> str:
    """Every milestone's command in the first reply, then the confirmation: the bootstrap's own
    reply format, so SFT on these replays teaches a tiny policy new tasks without teaching it a
    new way of answering (one milestone per turn did: held-out turn limits went from 0 to 28 of 80)."""
    rb = _runbook_in(conversation)
    if any(m["role"] == "assistant" for m in conversation):
        return format_reply([], task_complete=True)
    return format_reply([(m.command + "\n", m.wait) for m in rb.milestones if m.command], task_complete=True)


def replay(policy, tasks: Sequence, runbooks: Sequence, m: int, backend: str, budgets: Budgets,
           show_progress: bool = False, concurrency: int = 8) -> list[list[Episode]]:
    """M replays per (task, runbook) pair under the common harness, each in a fresh sandbox."""
    flat_tasks = [t for t in tasks for _ in range(m)]
    context = [rb.render() for rb in runbooks for _ in range(m)]
    episodes = run_episodes(policy, flat_tasks, CommonHarness(), backend=backend, budgets=budgets,
                            context=context, show_progress=show_progress, concurrency=concurrency)
    return [episodes[i * m:(i + 1) * m] for i in range(len(tasks))]


def deterministic_executor(tokenizer, one_reply: bool = False) -> ScriptedPolicy:
    return ScriptedPolicy(follow_runbook_in_one_reply if one_reply else follow_runbook, tokenizer)
