"""SFT step time of the demo bootstrap: the `tiny` model, batch 4, episodes of 1-3k tokens.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sft_step.py
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_sft_step.py --pad_multiple 1024 --steps 12

Runs the real `SFTTrainer` step (same jit, shardings and donation as `make demo`) on random
episodes of 1-3k tokens (~30% assistant tokens), batch and learning settings from the `demo`
pipeline preset. By default max_len 3072 and pad_multiple 1024, the setting in which the 3.4
s/step baseline was measured (../shared/FINDINGS.md); `--demo_lengths` takes max_len and
pad_multiple from today's demo preset instead. Every distinct padded shape is compiled before
timing. Prints the steady-state step time, tokens/s (padded and real) and the speed-up.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import jax
import numpy as np
from flax import nnx

from trsi_jax.config import model_preset
from trsi_jax.models import Qwen
from trsi_jax.pipeline.config import pipeline_preset
from trsi_jax.train.data import BucketedBatches, SFTExample
from trsi_jax.train.sft import SFTTrainer

BASELINE_S = 3.4  # s/step, ../shared/FINDINGS.md (demo bootstrap, before issue 16)


def _episodes(n: int, vocab: int, seed: int) -> list[SFTExample]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = int(rng.integers(1000, 3000))
        mask = (rng.random(t) < 0.3).astype(np.int32)
        out.append(SFTExample(rng.integers(0, vocab, t).astype(np.int32), mask))
    return out


def main():
    sft = pipeline_preset("demo").bootstrap
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=sft.batch_size)
    p.add_argument("--pad_multiple", type=int, default=1024)
    p.add_argument("--max_len", type=int, default=3072)
    p.add_argument("--demo_lengths", action="store_true", help="max_len and pad_multiple of the demo preset")
    p.add_argument("--steps", type=int, default=8, help="timed steps (after one compile per shape)")
    p.add_argument("--remat", default=None, help="override ModelConfig.remat")
    p.add_argument("--hidden", type=int, default=None, help="override the tiny preset's hidden size")
    p.add_argument("--attn_block", type=int, default=None, help="override ModelConfig.attn_block")
    p.add_argument("--gdn_chunk", type=int, default=None, help="override ModelConfig.gdn_chunk_size")
    args = p.parse_args()
    if args.demo_lengths:
        args.max_len, args.pad_multiple = sft.max_len, sft.pad_multiple

    cfg = model_preset("tiny")
    if args.remat:
        cfg = dataclasses.replace(cfg, remat=args.remat)
    if args.attn_block:
        cfg = dataclasses.replace(cfg, attn_block=args.attn_block)
    if args.gdn_chunk:
        cfg = dataclasses.replace(cfg, gdn_chunk_size=args.gdn_chunk)
    if args.hidden:
        cfg = dataclasses.replace(cfg, hidden_size=args.hidden, intermediate_size=2 * args.hidden)
    sft = dataclasses.replace(sft, batch_size=args.batch, pad_multiple=args.pad_multiple, max_len=args.max_len,
                              checkpoint_every=10 ** 9, log_every=10 ** 9)
    sft = dataclasses.replace(sft, optim=dataclasses.replace(sft.optim, total_steps=10 ** 6))
    examples = _episodes(8 * args.batch, cfg.vocab_size, seed=0)
    with tempfile.TemporaryDirectory() as workdir:
        trainer = SFTTrainer(Qwen(cfg, rngs=nnx.Rngs(0)), sft, workdir)
        data = BucketedBatches(examples, sft.batch_size, sft.seed, sft.max_len, 0, sft.pad_multiple,
                               sft.bucket_window)
        batches = [data.batch(s) for s in range(args.steps)]

        def step(batch):
            with jax.set_mesh(trainer.mesh):
                trainer.params, trainer.opt_state, m = trainer._step_fn(
                    trainer.params, trainer.rest, trainer.opt_state, trainer._put(batch))
            return float(jax.device_get(m["loss"]))

        shapes = {}
        for b in batches:  # compile (and warm) every shape first
            if b["tokens_BT"].shape not in shapes:
                t0 = time.perf_counter()
                step(b)
                shapes[b["tokens_BT"].shape] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for b in batches:
            step(b)
        elapsed = time.perf_counter() - t0
    padded = sum(b["tokens_BT"].size for b in batches)
    real = sum(int(b["mask_BT"].sum()) for b in batches)
    per_step = elapsed / len(batches)
    print(f"model: tiny hidden={cfg.hidden_size} layers={cfg.num_layers} remat={cfg.remat} "
          f"attn_block={cfg.attn_block} gdn_chunk={cfg.gdn_chunk_size}; batch {sft.batch_size}, "
          f"pad_multiple {sft.pad_multiple}, shapes {sorted(s[1] for s in shapes)} "
          f"(first call incl. compile: {', '.join(f'{v:.1f}s' for v in shapes.values())})")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"step time: {per_step * 1e3:.0f} ms over {len(batches)} steps; "
          f"{padded / elapsed:,.0f} padded tokens/s, {real / elapsed:,.0f} real tokens/s")
    like = args.max_len == 3072 and args.pad_multiple == 1024
    print(f"speed-up vs {BASELINE_S} s/step baseline (max_len 3072, pad 1024"
          f"{'' if like else '; NOT like for like: other lengths here'}): {BASELINE_S / per_step:.1f}x")


if __name__ == "__main__":
    main()
