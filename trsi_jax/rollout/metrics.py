"""Evaluation metrics over episodes: pass@k (unbiased), strict success, process reward, per family.

Infrastructure failures (`episodes.INFRA_FAILURES`: the sandbox broke or the verifier produced no
result) say nothing about the policy: they are left out of every numerator and denominator and
counted as `infra_failures`; `tasks` and `episodes` count what was scored.
"""
from __future__ import annotations

from collections import defaultdict
from math import comb
from typing import Sequence

from trsi_jax.rollout.episodes import Episode, is_infra_failure


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples, c correct, is correct)
    = 1 - C(n-c, k) / C(n, k)  (Chen et al., 2021), exact in integers."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def _summary(all_eps: Sequence[Episode], ks: Sequence[int]) -> dict:
    eps = [ep for ep in all_eps if not is_infra_failure(ep)]
    by_task: dict[str, list[Episode]] = defaultdict(list)
    for ep in eps:
        by_task[ep.task_id].append(ep)
    out = {"tasks": len(by_task), "episodes": len(eps), "infra_failures": len(all_eps) - len(eps)}
    if not eps:  # nothing was scored: no rate exists
        return {**out, "strict_success": float("nan"), "process_reward": float("nan")}
    out["strict_success"] = sum(ep.strict for ep in eps) / len(eps)
    # process reward: mean over tasks of the final progress (fraction of verifier tests passed)
    out["process_reward"] = sum(sum(e.partial for e in t) / len(t) for t in by_task.values()) / len(by_task)
    for k in ks:
        # pass@k over the tasks with at least k scored samples (an infra failure removes a sample)
        tasks = [t for t in by_task.values() if len(t) >= k]
        if tasks:
            out[f"pass@{k}"] = sum(pass_at_k(len(t), sum(e.strict for e in t), k) for t in tasks) / len(tasks)
    return out


def summarize(episodes: Sequence[Episode], ks: Sequence[int] = (1,)) -> dict:
    """{"all": metrics, "families": {family: metrics}}; pass@k over the tasks with >= k scored samples."""
    if not episodes:
        raise ValueError("summarize needs at least one episode")
    fams: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        fams[ep.family].append(ep)
    return {"all": _summary(episodes, ks), "families": {f: _summary(e, ks) for f, e in sorted(fams.items())}}
