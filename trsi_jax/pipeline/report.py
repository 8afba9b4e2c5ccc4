"""What the pipeline shows: one line per stage, the per-stage tables and the plot.

Every table takes a list of runs (one per seed). A cell is the value of a single run, or the mean
± the half-width of the 95% t-interval over seeds (mean ± t_{0.975, n−1} · s / √n), so the demo
and `bench_pipeline --seeds=0,1,2` print the same table.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

Run = dict[str, dict[str, Any]]  # stage -> that stage's record (evaluation or RSR report)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the two-sided 95% Student-t interval); NaN half-width for one value.
    NaN values (nothing scored) are left out."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], np.float64)
    if x.size == 0:
        return float("nan"), float("nan")
    if x.size == 1:
        return float(x[0]), float("nan")
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
    return float(x.mean()), float(half)


def cell(values: Sequence[float], digits: int = 3) -> str:
    if not values:
        return "-"
    mean, half = mean_ci(values)
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def _format(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: " | ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), "-+-".join("-" * w for w in widths), *map(line, rows)])


def _stages(runs: Sequence[Run]) -> list[str]:
    """Stages in the first run's order, then any only later runs have."""
    seen: dict[str, None] = {}
    for run in runs:
        seen.update(dict.fromkeys(run))
    return list(seen)


def eval_table(runs: Sequence[Run]) -> str:
    """Held-out table, rows = stages: pass@k, strict success, process reward, strict success per
    family, and infrastructure failures (episodes left out) when there were any."""
    if not runs or not runs[0]:
        return "(no evaluated stages)"
    stages = _stages(runs)
    evals = [run[s] for run in runs for s in run]
    ks = sorted({k for e in evals for k in e["all"] if k.startswith("pass@")}, key=lambda k: int(k[5:]))
    cols = ks + ["strict_success", "process_reward"]
    families = sorted({f for e in evals for f in e["families"]})
    infra = any(e["all"].get("infra_failures", 0) for e in evals)
    header = ["stage", *cols, *[f"{f}:strict" for f in families]] + (["infra failures"] if infra else [])
    rows = []
    for stage in stages:
        per_seed = [run[stage] for run in runs if stage in run]
        row = [stage] + [cell([e["all"].get(c, float("nan")) for e in per_seed]) for c in cols]
        row += [cell([e["families"][f]["strict_success"] for e in per_seed if f in e["families"]]) for f in families]
        if infra:
            row.append(cell([e["all"].get("infra_failures", 0) for e in per_seed], 1))
        rows.append(row)
    return _format(header, rows)


RUNBOOK_COLUMNS = (("written", "written"), ("rejected", "rejected"), ("revisions", "revised"),
                   ("accepted", "accepted"), ("accepted_after_revision", "after revision"),
                   ("revised_verified", "revised+verified"))
RSR_LEGEND = ("train tasks solved per harness and by their union | successes | runbooks: written, rejected "
              "for good, revisions, accepted, accepted after a revision, of those with a verified replay | "
              "verified replays | SFT examples | infrastructure failures")


def rsr_table(runs: Sequence[Run]) -> str:
    """RSR stages, rows = stages: tasks solved per harness and by their union, successes, the
    runbook funnel (written, rejected by the critic for good, revisions, accepted, accepted
    after a revision, of those with a verified replay), verified replays, SFT examples and
    infrastructure failures; a legend line first."""
    stages = _stages(runs)
    if not stages:
        return "(no RSR stages)"
    harnesses = list(dict.fromkeys(h for run in runs for r in run.values() for h in r["coverage"]["per_harness"]))
    header = (["stage", "tasks", *harnesses, "union", "successes"] + [name for _, name in RUNBOOK_COLUMNS]
              + ["replays ok", "SFT", "infra"])
    rows = []
    for stage in stages:
        per = [run[stage] for run in runs if stage in run]
        get = lambda fn: cell([float(fn(r)) for r in per], 1 if len(per) > 1 else 0)  # noqa: E731
        row = [stage, get(lambda r: r["coverage"]["tasks"])]
        row += [get(lambda r, h=h: r["coverage"]["per_harness"].get(h, 0)) for h in harnesses]
        row += [get(lambda r: r["coverage"]["union"]), get(lambda r: r["successes"])]
        row += [get(lambda r, k=k: r["runbooks"].get(k, math.nan)) for k, _ in RUNBOOK_COLUMNS]  # nan: older report
        row += [get(lambda r: r["replays"]["verified"]), get(lambda r: r["sft_examples"]),
                get(lambda r: r.get("infra_failures", 0))]
        rows.append(row)
    return RSR_LEGEND + "\n" + _format(header, rows)


def stage_line(stage: str, summary: dict, evaluation: dict, reused: bool = False) -> str:
    """One line for a finished stage: time (or "reused" when an earlier run finished it), held-out
    results and what the stage itself did."""
    a = evaluation["all"]
    passes = " ".join(f"{k} {a[k]:.3f}" for k in a if k.startswith("pass@"))
    took = "reused" if reused else f"{summary.get('seconds', 0.0):5.0f}s"
    parts = [f"{stage:<6} {took:>6}",
             f"held-out strict {a['strict_success']:.3f} {passes} process {a['process_reward']:.3f}"]
    if a.get("infra_failures"):
        parts.append(f"{a['infra_failures']} infra failures left out")
    if "coverage" in summary:
        cov, rb = summary["coverage"], summary["runbooks"]
        parts.append(f"solved {cov['union']}/{cov['tasks']} train tasks ({summary['successes']} successes), runbooks "
                     f"{rb['written']} written / {rb['rejected']} rejected / {rb['revisions']} revised / "
                     f"{rb['accepted']} accepted, {summary['sft_examples']} SFT examples")
    if "updates" in summary:
        m = summary.get("last_metrics") or {}
        parts.append(f"{summary['updates']} PPO updates, last train success "
                     f"{m.get('rollout/strict_success', float('nan')):.3f}")
    return " | ".join(parts)


def plot(runs: Sequence[Run], path: str, title: str) -> None:
    """PNG of held-out strict success and process reward per stage (error bars: 95% t-interval
    over seeds when there are several runs)."""
    from matplotlib.figure import Figure

    stages = _stages(runs)
    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.subplots()
    x = np.arange(len(stages))
    for metric, label, marker in (("strict_success", "held-out strict success", "o"),
                                  ("process_reward", "held-out process reward", "s")):
        stats = [mean_ci([run[s]["all"][metric] for run in runs if s in run]) for s in stages]
        mean = np.array([m for m, _ in stats])
        half = np.array([0.0 if math.isnan(h) else h for _, h in stats])
        ax.errorbar(x, mean, yerr=half if half.any() else None, marker=marker, capsize=4, label=label)
    ax.set_xticks(x, stages)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
