"""Benchmark (not a test): the full tiny pipeline on the built-in suite, per seed, plus the
paper's control — plain SFT on the raw successful trajectories RSR-1 collected, from the same
base policy with the same SFT schedule — evaluated on the same held-out tasks.

    JAX_PLATFORMS=cpu python -m benchmarks.bench_pipeline --seeds=0,1,2 --workdir=runs/bench

Prints one line per seed, then the demo's tables over the seeds (each cell the mean ± the
half-width of the 95% t-interval): held-out results per stage with the raw-SFT control row, the
RSR coverage and runbook counts, and the issue's targets (paired differences per seed). Writes
`report.png` (strict success and process reward per stage, with intervals) and `bench.json` into
--workdir. Finished stages are reused on a re-run (the pipeline skips them; their time is not
re-measured).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import jax
from absl import app, flags

from experiments import common
from trsi_jax.pipeline import report as report_lib
from trsi_jax.pipeline.config import PipelineConfig, pipeline_preset
from trsi_jax.pipeline.evaluate import evaluate_policy
from trsi_jax.pipeline.reuse import check_reuse, fingerprint
from trsi_jax.pipeline.run import RSR_STAGES, Pipeline, quiet_library_logs
from trsi_jax.rollout import load_episodes
from trsi_jax.rpr.handoff import load_policy
from trsi_jax.train.data import SFTExample
from trsi_jax.train.sft import SFTTrainer

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0"], "pipeline seeds (model init, task schedules, sampling)")
flags.DEFINE_string("preset", "demo", "pipeline preset")
flags.DEFINE_string("tokenizer", "byte", "'byte' or an HF tokenizer folder (default: the --init_hf folder's)")
common.define_runtime_flags()
common.define_hf_flags()
common.define_config_flags("pipeline", PipelineConfig)
# The demo starts from the shipped base (made by `experiments.make_base`), as `make demo` does.
FLAGS.set_default("init_hf", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                          "trsi_jax", "assets", "tiny_base"))
CONTROL = "raw-sft (control)"


def with_seed(cfg, seed: int):
    """Every stage of the preset under one seed."""
    stages = {name: dataclasses.replace(getattr(cfg, name), seed=seed) for name in ("rsr1", "rpr1", "rsr2", "rpr2")}
    return dataclasses.replace(cfg, seed=seed, **stages)


def raw_sft_control(pipe: Pipeline) -> dict:
    """SFT of the base policy on RSR-1's raw verified episodes (every harness, no rewriting)."""
    out_dir = os.path.join(pipe.workdir, "control-raw-sft")
    done = os.path.join(out_dir, "eval.json")
    # RSR-1's record covers the base, the collect and the SFT schedule; the base's eval record the evaluation.
    config = fingerprint(rsr1=pipe.stage_config("rsr-1"), eval=pipe.eval_config("base"))
    if os.path.exists(done):
        with open(done) as f:
            result = json.load(f)
        check_reuse(f"the raw-SFT control {done}", result.get("config"), config, [out_dir])
        return result
    collect_dir = os.path.join(pipe.stage_dir("rsr-1"), "collect")
    raw = [ep for h in pipe.cfg.rsr1.harnesses for ep in load_episodes(os.path.join(collect_dir, h)) if ep.strict]
    policy, _ = load_policy(pipe.checkpoints("base"), pipe.model_cfg, pipe.mesh)
    if raw:
        trainer = SFTTrainer(policy, pipe.cfg.rsr1.sft, out_dir, mesh=pipe.mesh, pad_id=pipe.tokenizer.pad_id)
        trainer.train([SFTExample(ep.tokens, ep.policy_mask) for ep in raw], progress=pipe.show_progress)
    cfg = pipe.cfg
    result = evaluate_policy(policy, pipe.heldout_tasks, pipe.tokenizer, samples=cfg.eval_samples,
                             temperature=cfg.eval_temperature, max_turns=cfg.eval_max_turns,
                             max_new_tokens=cfg.eval_max_new_tokens, max_len=cfg.max_len, backend=cfg.backend,
                             seed=cfg.seed, show_progress=pipe.show_progress, desc="eval[raw-sft]",
                             concurrency=cfg.concurrency)
    result["raw_examples"], result["config"] = len(raw), config
    os.makedirs(out_dir, exist_ok=True)
    with open(done, "w") as f:
        json.dump(result, f, indent=2)
    return result


def _strict(run: dict, stage: str) -> float:
    return run[stage]["all"]["strict_success"]


def targets(evals: list[dict], rsrs: list[dict]) -> str:
    """The issue's targets, each as the measured mean ± 95% interval over seeds (differences
    paired per seed) and whether it is met."""
    def line(name, values, ok):
        values = [v for v in values if not math.isnan(v)]  # NaN: a report older than the field
        if not values:
            return f"n/a    {name}: no report has it"
        mean, half = report_lib.mean_ci(values)
        interval = "" if math.isnan(half) else f" ± {half:.3f}"
        return f"{'met   ' if ok(mean) else 'MISSED'} {name}: {mean:.3f}{interval} (n={len(values)})"

    rsr1 = [r["rsr-1"] for r in rsrs]
    return "\n".join([
        line("base held-out strict success in [0.05, 0.50]", [_strict(e, "base") for e in evals],
             lambda m: 0.05 <= m <= 0.50),
        line("RPR-2 minus base strict success >= 0.15", [_strict(e, "rpr-2") - _strict(e, "base") for e in evals],
             lambda m: m >= 0.15),
        line("RSR-1 minus raw-SFT control strict success > 0",
             [_strict(e, "rsr-1") - _strict(e, CONTROL) for e in evals], lambda m: m > 0),
        line("RSR-1 tasks solved by the union minus the best single harness > 0",
             [r["coverage"]["union"] - max(r["coverage"]["per_harness"].values(), default=0) for r in rsr1],
             lambda m: m > 0),
        line("RSR-1 runbooks accepted after a critic rejection >= 1",
             [r["runbooks"]["accepted_after_revision"] for r in rsr1], lambda m: m >= 1),
        line("  of those, with a verified replay (not a target) >= 1",
             [r["runbooks"].get("revised_verified", math.nan) for r in rsr1], lambda m: m >= 1),
    ])


def main(argv):
    del argv
    quiet_library_logs()
    common.init_runtime()
    tokenizer = common.tokenizer_from_flags()
    preset = common.config_from_flags("pipeline", pipeline_preset(FLAGS.preset))
    evals, rsrs, walls, demo_walls = [], [], [], []
    main_process = jax.process_index() == 0
    for seed in map(int, FLAGS.seeds):
        start = time.perf_counter()
        pipe = Pipeline(with_seed(preset, seed), common.model_config_from_flags(),
                        os.path.join(FLAGS.workdir, f"seed{seed}"), tokenizer, init_hf=FLAGS.init_hf)
        report = pipe.run()
        demo_walls.append(time.perf_counter() - start)
        control = raw_sft_control(pipe)
        walls.append(time.perf_counter() - start)
        evals.append({**report["eval"], CONTROL: control})
        rsrs.append({s: report["stages"][s] for s in RSR_STAGES})
        if main_process:
            print(f"== seed {seed}: wall {walls[-1]:.0f} s (the pipeline {demo_walls[-1]:.0f} s), control trained on "
                  f"{control['raw_examples']} raw successes; base -> rpr-2 strict {_strict(evals[-1], 'base'):.3f} -> "
                  f"{_strict(evals[-1], 'rpr-2'):.3f}", flush=True)
    if not main_process:
        return
    n = len(evals)
    title = f"mean ± 95% t-interval over {n} seed(s)" if n > 1 else "one seed"
    print(f"\nHeld-out evaluation per stage ({title}):\n" + report_lib.eval_table(evals))
    print(f"\nRSR stages ({title}):\n" + report_lib.rsr_table(rsrs))
    print("\nTargets (issue 14):\n" + targets(evals, rsrs))
    print(f"\nwall per seed: {report_lib.cell(walls, 0)} s, of which the pipeline (`make demo`'s run) "
          f"{report_lib.cell(demo_walls, 0)} s (reused stages are not re-timed)")
    report_lib.plot(evals, os.path.join(FLAGS.workdir, "report.png"), f"Terminal-RSI per stage ({title})")
    with open(os.path.join(FLAGS.workdir, "bench.json"), "w") as f:
        json.dump({"seeds": [int(s) for s in FLAGS.seeds], "eval": evals, "rsr": rsrs, "wall_sec": walls,
                   "pipeline_wall_sec": demo_walls}, f, indent=2)


if __name__ == "__main__":
    app.run(main)
