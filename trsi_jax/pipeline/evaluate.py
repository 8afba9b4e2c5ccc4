"""Held-out evaluation of one stage's policy (tables and plot: `pipeline.report`)."""
from __future__ import annotations

from typing import Any, Sequence

from trsi_jax.agent import make_harness
from trsi_jax.rollout import Budgets, ModelPolicy, SampleConfig, run_episodes, summarize


def evaluate_policy(model, tasks: Sequence, tokenizer, *, samples: int, temperature: float,
                    max_turns: int, max_new_tokens: int, max_len: int, backend: str = "local",
                    seed: int = 0, show_progress: bool = True, desc: str = "eval",
                    concurrency: int = 8) -> dict[str, Any]:
    """`samples` episodes per task under the common harness -> pass@1 / pass@samples, strict
    success, process reward (mean verifier partial credit), overall and per family; episodes
    whose sandbox or verifier failed are left out of every rate and counted (`infra_failures`)."""
    policy = ModelPolicy(model, tokenizer, SampleConfig(temperature=temperature, max_new_tokens=max_new_tokens),
                         max_len=max_len, seed=seed)
    episodes = run_episodes(policy, [t for t in tasks for _ in range(samples)], make_harness("common"),
                            backend=backend, budgets=Budgets(max_turns=max_turns, max_tokens=max_len),
                            show_progress=show_progress, desc=desc, concurrency=concurrency)
    ks = sorted({1, samples})
    summary = summarize(episodes, ks=ks)
    summary["outcomes"] = {o: sum(e.outcome == o for e in episodes) for o in sorted({e.outcome for e in episodes})}
    return summary
