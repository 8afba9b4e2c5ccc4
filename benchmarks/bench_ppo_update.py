"""PPO update time of the demo's RPR: minibatches cut to their longest row vs kept at the batch's width.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_ppo_update.py
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_ppo_update.py --long_frac 0.3

One RPR update of the demo preset (the shipped tiny base as policy and critic, 16 tasks x 4
samples = 64 rows, minibatches of 4, one epoch; `score` then `update`) on random tokens in episodes
as long as the demo's: the shipped base's 80 held-out episodes (2026-12-06) had a median of 791
tokens, 75% up to 906, 90% up to 1,307 and 9% at the context limit; here 75% are uniform in
[550, 910), 15% in [910, 1310) and --long_frac at max_len. The batch is right-padded to its longest row, as
`rpr.batch` builds it. The reference is the same learner with `trimmed_width` returning the full
width (every minibatch as wide as the batch: the behaviour before minibatches were cut). Both run
side by side, interleaved, every shape compiled first; prints the best of --repeats each and the
ratio, with the load average.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import numpy as np

from experiments.export import checkpoint_model_config
from trsi_jax.models import Critic
from trsi_jax.pipeline.config import pipeline_preset
from trsi_jax.rpr.handoff import load_policy
from trsi_jax.sharding import make_mesh
from trsi_jax.train import ppo as ppo_lib

BASE = os.path.join(os.path.dirname(__file__), "..", "trsi_jax", "assets", "tiny_base")


def _batch(rows: int, max_len: int, long_frac: float, vocab: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    u = rng.random(rows)
    lengths = np.where(u < 0.75, rng.integers(550, 910, rows),
                       np.where(u < 1 - long_frac, rng.integers(910, 1310, rows), max_len))
    width = int(lengths.max())
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    policy_mask = mask * (rng.random((rows, width)) < 0.4)
    return {"tokens": rng.integers(0, vocab, (rows, width)).astype(np.int32), "mask": mask,
            "policy_mask": policy_mask.astype(np.int32),
            "advantages": (rng.normal(size=(rows, width)) * policy_mask).astype(np.float32),
            "returns": (rng.normal(size=(rows, width)) * policy_mask).astype(np.float32)}


def _update(learner, batch: dict, seed: int) -> float:
    start = time.perf_counter()
    scored = learner.score(batch)
    learner.update({**batch, **scored}, seed=seed, train_policy=True)
    jax.block_until_ready(learner.policy_params)
    return time.perf_counter() - start


def main():
    demo = pipeline_preset("demo")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max_len", type=int, default=demo.max_len)
    p.add_argument("--long_frac", type=float, default=0.1, help="rows cut at the context limit")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    cfg = demo.rpr1
    rows = cfg.tasks_per_update * cfg.samples_per_task
    mesh = make_mesh(demo.mesh)
    policy, _ = load_policy(BASE, checkpoint_model_config(BASE), mesh)
    batches = [_batch(rows, args.max_len, args.long_frac, policy.cfg.vocab_size, s)
               for s in range(args.repeats)]
    full_width = lambda mask_BT, minimum=128: mask_BT.shape[1]  # noqa: E731 (the reference)
    trimmed = ppo_lib.trimmed_width

    def learner():
        return ppo_lib.PPOLearner(policy, Critic.from_policy(policy), cfg.ppo, cfg.policy_optim, cfg.critic_optim,
                                  mesh, temperature=cfg.temperature)

    runs = {"cut minibatches": (learner(), trimmed), "full width": (learner(), full_width)}
    for name, (lrn, width_fn) in runs.items():  # compile every shape
        ppo_lib.trimmed_width = width_fn
        for b in batches:
            _update(lrn, b, 0)
    best = {name: float("inf") for name in runs}
    for r, b in enumerate(batches):
        for name, (lrn, width_fn) in runs.items():
            ppo_lib.trimmed_width = width_fn
            best[name] = min(best[name], _update(lrn, b, r))
    ppo_lib.trimmed_width = trimmed
    tokens = np.mean([b["mask"].sum() for b in batches])
    print(f"PPO update (score + {cfg.ppo.epochs} epoch(s)), {rows} rows, minibatch {cfg.ppo.minibatch_size}, "
          f"{args.long_frac:.0%} of rows at {args.max_len} tokens; "
          f"~{tokens:.0f} real tokens; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, sec in best.items():
        print(f"{name:18s} {sec:7.2f} s  ({tokens / sec:7.0f} real tokens/s)")
    print(f"ratio (full width / cut): {best['full width'] / best['cut minibatches']:.2f}x")


if __name__ == "__main__":
    main()
