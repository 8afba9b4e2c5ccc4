"""Benchmark (not a test): the full tiny pipeline on the built-in suite, per seed, plus the
paper's control — plain SFT on the raw successful trajectories RSR-1 collected, from the same
base policy with the same SFT schedule — evaluated on the same held-out tasks.

    JAX_PLATFORMS=cpu python -m benchmarks.bench_pipeline --seeds=0,1 --workdir=runs/bench

Prints, per seed, the per-stage held-out table with the control row and the wall time, then the
two comparisons the method claims: strict success base -> RPR-2, and RSR-1 vs raw-trajectory SFT.
Finished stages are reused on a re-run (the pipeline skips them).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
from absl import app, flags

from experiments import common
from trsi_jax.pipeline.config import pipeline_preset
from trsi_jax.pipeline.evaluate import evaluate_policy, format_table
from trsi_jax.pipeline.run import Pipeline
from trsi_jax.rollout import load_episodes, load_tokenizer
from trsi_jax.rpr.handoff import load_policy
from trsi_jax.train.data import SFTExample
from trsi_jax.train.sft import SFTTrainer

FLAGS = flags.FLAGS
flags.DEFINE_list("seeds", ["0"], "pipeline seeds (model init, task schedules, sampling)")
flags.DEFINE_string("preset", "demo", "pipeline preset")
common.define_runtime_flags()


def with_seed(cfg, seed: int):
    """Every stage of the preset under one seed."""
    stages = {name: dataclasses.replace(getattr(cfg, name), seed=seed) for name in ("rsr1", "rpr1", "rsr2", "rpr2")}
    return dataclasses.replace(cfg, seed=seed, **stages)


def raw_sft_control(pipe: Pipeline) -> dict:
    """SFT of the base policy on RSR-1's raw verified episodes (every harness, no rewriting)."""
    out_dir = os.path.join(pipe.workdir, "control-raw-sft")
    done = os.path.join(out_dir, "eval.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
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
                             seed=cfg.seed, show_progress=pipe.show_progress)
    result["raw_examples"] = len(raw)
    os.makedirs(out_dir, exist_ok=True)
    with open(done, "w") as f:
        json.dump(result, f, indent=2)
    return result


def main(argv):
    del argv
    common.init_runtime()
    tokenizer = load_tokenizer("byte")
    rows = []
    for seed in map(int, FLAGS.seeds):
        cfg = with_seed(pipeline_preset(FLAGS.preset), seed)
        start = time.perf_counter()
        pipe = Pipeline(cfg, common.model_config_from_flags(), os.path.join(FLAGS.workdir, f"seed{seed}"), tokenizer)
        report = pipe.run()
        control = raw_sft_control(pipe)
        wall = time.perf_counter() - start
        table = dict(report["eval"])
        table["raw-sft (control)"] = control
        strict = {k: v["all"]["strict_success"] for k, v in table.items()}
        process = {k: v["all"]["process_reward"] for k, v in table.items()}
        rows.append((seed, strict, process, wall, control["raw_examples"]))
        if jax.process_index() == 0:
            print(f"\n== seed {seed}: wall {wall:.0f} s (stages reused from earlier runs are not re-timed)")
            print(format_table(table))
    if jax.process_index() != 0:
        return
    print("\nseed | strict base -> rpr-2 | strict rsr-1 vs raw-sft | process rsr-1 vs raw-sft | raw examples | wall s")
    for seed, strict, process, wall, n_raw in rows:
        print(f"{seed:4d} | {strict['base']:.3f} -> {strict['rpr-2']:.3f} | "
              f"{strict['rsr-1']:.3f} vs {strict['raw-sft (control)']:.3f} | "
              f"{process['rsr-1']:.3f} vs {process['raw-sft (control)']:.3f} | {n_raw:12d} | {wall:.0f}")


if __name__ == "__main__":
    app.run(main)
