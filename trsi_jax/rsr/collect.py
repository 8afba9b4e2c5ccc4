"""Collect: run the policy on the training tasks under H harnesses; keep verified successes.

Coverage counts distinct tasks solved (strict success) by each harness and by their union, and
the episodes per harness whose sandbox or verifier failed (never successes, never SFT data).
"""
from __future__ import annotations

import os
from typing import Sequence

from trsi_jax.agent import make_harness
from trsi_jax.rollout import Budgets, Episode, load_episodes, run_episodes, save_episodes
from trsi_jax.rollout.episodes import is_infra_failure


def collect(policy, tasks: Sequence, harnesses: Sequence[str], samples: int, backend: str, budgets: Budgets,
            out_dir: str, show_progress: bool = False, concurrency: int = 8) -> dict[str, list[Episode]]:
    """Episodes per harness (`samples` per task), saved as `out_dir/<harness>`; a harness whose
    folder is already there is loaded instead of re-run (the phase resumes per harness)."""
    out = {}
    for name in harnesses:
        path = os.path.join(out_dir, name)
        if os.path.exists(os.path.join(path, ".done")):
            out[name] = load_episodes(path)
            continue
        episodes = run_episodes(policy, [t for t in tasks for _ in range(samples)], make_harness(name),
                                backend=backend, budgets=budgets, track_progress=False, concurrency=concurrency,
                                show_progress=show_progress, desc=f"collect[{name}]")
        save_episodes(episodes, path)
        open(os.path.join(path, ".done"), "w").close()
        out[name] = episodes
    return out


def successes(by_harness: dict[str, list[Episode]]) -> list[Episode]:
    """Every strict success, first one per (task, harness, messages) kept once."""
    seen, out = set(), []
    for name, episodes in by_harness.items():
        for ep in episodes:
            key = (ep.task_id, name, tuple(m["content"] for m in ep.messages))
            if ep.strict and not is_infra_failure(ep) and key not in seen:
                seen.add(key)
                out.append(ep)
    return out


def coverage(by_harness: dict[str, list[Episode]], num_tasks: int) -> dict:
    """Tasks solved per harness and by the union, with the union's gain over the best single one."""
    solved = {name: sorted({ep.task_id for ep in eps if ep.strict}) for name, eps in by_harness.items()}
    union = sorted(set().union(*solved.values())) if solved else []
    best = max((len(v) for v in solved.values()), default=0)
    return {
        "tasks": num_tasks,
        "per_harness": {name: len(v) for name, v in solved.items()},
        "union": len(union),
        "union_gain_over_best": (len(union) - best) / best if best else None,
        "infra_failures": {name: sum(map(is_infra_failure, eps)) for name, eps in by_harness.items()},
    }
