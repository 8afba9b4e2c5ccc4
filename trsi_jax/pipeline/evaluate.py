"""Held-out evaluation of one stage's policy and the per-stage table the pipeline prints."""
from __future__ import annotations

from typing import Any, Sequence

from trsi_jax.agent import make_harness
from trsi_jax.rollout import Budgets, ModelPolicy, SampleConfig, run_episodes, summarize


def evaluate_policy(model, tasks: Sequence, tokenizer, *, samples: int, temperature: float,
                    max_turns: int, max_new_tokens: int, max_len: int, backend: str = "local",
                    seed: int = 0, show_progress: bool = True) -> dict[str, Any]:
    """`samples` episodes per task under the common harness -> pass@1 / pass@samples, strict
    success, process reward (mean verifier partial credit), overall and per family."""
    policy = ModelPolicy(model, tokenizer, SampleConfig(temperature=temperature, max_new_tokens=max_new_tokens),
                         max_len=max_len, seed=seed)
    episodes = run_episodes(policy, [t for t in tasks for _ in range(samples)], make_harness("common"),
                            backend=backend, budgets=Budgets(max_turns=max_turns, max_tokens=max_len),
                            show_progress=show_progress)
    ks = sorted({1, samples})
    summary = summarize(episodes, ks=ks)
    summary["outcomes"] = {o: sum(e.outcome == o for e in episodes) for o in sorted({e.outcome for e in episodes})}
    return summary


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """Rows = stages in order, columns = overall metrics then strict success per family."""
    if not results:
        return "(no evaluated stages)"
    first = next(iter(results.values()))
    metric_cols = [k for k in first["all"] if k.startswith("pass@")] + ["strict_success", "process_reward"]
    families = sorted({f for r in results.values() for f in r["families"]})
    header = ["stage", *metric_cols, *[f"{f}:strict" for f in families]]
    rows = []
    for stage, r in results.items():
        row = [stage] + [f"{r['all'].get(c, float('nan')):.3f}" for c in metric_cols]
        row += [f"{r['families'][f]['strict_success']:.3f}" if f in r["families"] else "-" for f in families]
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), "-+-".join("-" * w for w in widths), *map(line, rows)])
