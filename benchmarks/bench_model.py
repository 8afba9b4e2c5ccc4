"""Forward throughput vs `transformers` (torch, same weights, same device) and train-step vs the matmul bound.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_model.py            # 4 layers, hidden 256, T=512, B=4
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_model.py --seq 2048
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_model.py --hidden 512   # the 30%-of-bound target

Builds a random Qwen3_5ForCausalLM, saves it, imports it with `load_hf`, checks the logits agree,
then times both forwards side by side (interleaved, best of --repeats). In the same run it
measures this CPU's dense fp32 matmul rate (a large jnp matmul) and times our SFT train step
(forward + backward + AdamW), and compares the step with the matmul bound: 6 * params * tokens
FLOPs at the measured rate. Run it alone: the load average is printed beside the figures.
On a GPU (JAX's default backend `gpu` and torch built with CUDA) both models run there, in fp32.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from trsi_jax.config import OptimConfig
from trsi_jax.models import load_hf
from trsi_jax.models.hf_io import config_from_hf
from trsi_jax.train import sft
from trsi_jax.train.optim import make_optimizer


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def matmul_flops_per_s(n: int, repeats: int = 5) -> float:
    """Dense fp32 matmul rate of the default device through XLA (the bound for a train step)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, a).block_until_ready()
    return 2 * n ** 3 / _best_of(lambda: mm(a, a).block_until_ready(), repeats)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attn_block", type=int, default=None, help="override ModelConfig.attn_block (ours)")
    p.add_argument("--gdn_chunk", type=int, default=32,
                   help="ModelConfig.gdn_chunk_size (ours): 32 as in the CPU preset `tiny` (64 is slower on CPU)")
    p.add_argument("--gdn_impl", default="jax", help="ModelConfig.gdn_impl (ours): jax | pallas")
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    gpu = jax.default_backend() == "gpu" and torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    torch.manual_seed(0)
    heads = max(args.hidden // 64, 2)
    hf_cfg = Qwen3_5TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        intermediate_size=2 * args.hidden, num_attention_heads=heads, num_key_value_heads=heads // 2,
        head_dim=64, linear_num_key_heads=heads // 2, linear_num_value_heads=heads,
        linear_key_head_dim=64, linear_value_head_dim=64, attn_implementation="sdpa")
    ref = Qwen3_5ForCausalLM(hf_cfg).eval()  # saved from CPU, then moved
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        cfg = config_from_hf(tmp)
        model = load_hf(tmp, dataclasses.replace(cfg, attn_block=args.attn_block or cfg.attn_block,
                                                 gdn_chunk_size=args.gdn_chunk, gdn_impl=args.gdn_impl))
    ref = ref.to(device)

    tokens = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq))
    tokens_jax, tokens_pt = jnp.asarray(tokens), torch.tensor(tokens, device=device)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
    t0 = time.perf_counter()
    ours = np.asarray(forward(state, tokens_jax))
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        theirs = ref(input_ids=tokens_pt).logits.cpu().numpy()
    diff = float(np.abs(ours - theirs).max())
    print(f"compiled ours in {compile_s:.1f}s, max |logits diff| {diff:.2e}; timing the forwards", flush=True)

    def run_ref():
        with torch.no_grad():
            ref(input_ids=tokens_pt)
        sync()

    # Interleave the two so load changes hit both alike; keep the best of each.
    t_ours, t_ref = float("inf"), float("inf")
    for _ in range(args.repeats):
        t_ours = min(t_ours, _best_of(lambda: forward(state, tokens_jax).block_until_ready(), 1))
        t_ref = min(t_ref, _best_of(run_ref, 1))

    print("timing the train step", flush=True)
    # Train step: SFT loss on every token, AdamW; not donated so it can be re-run on the same state.
    tx = make_optimizer(OptimConfig(lr=1e-4))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    step = jax.jit(lambda p_, r_, o_, b_: sft._train_step(graphdef, tx, p_, r_, o_, b_))
    ones = jnp.ones_like(tokens_jax, dtype=jnp.int32)
    batch = {"tokens_BT": tokens_jax.astype(jnp.int32), "mask_BT": ones, "loss_mask_BT": ones}
    opt_state = tx.init(params)
    jax.block_until_ready(step(params, rest, opt_state, batch))
    t_step = _best_of(lambda: jax.block_until_ready(step(params, rest, opt_state, batch)), args.repeats)
    mm_n = 8192 if gpu else 2048
    rate = matmul_flops_per_s(mm_n)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    n = args.batch * args.seq
    bound_s = 6 * n_params * n / rate

    print(f"config: layers={args.layers} hidden={args.hidden} seq={args.seq} batch={args.batch} vocab={args.vocab} "
          f"attn_block={model.cfg.attn_block} gdn_chunk={model.cfg.gdn_chunk_size} gdn_impl={args.gdn_impl} "
          f"params={n_params:,} (fp32, {jax.devices()[0].device_kind}, torch on {device}, "
          f"threads={torch.get_num_threads()})")
    print(f"max |logits diff| = {diff:.2e}; jax compile {compile_s:.1f}s; load average {_load()}")
    print(f"forward trsi_jax (jit):        {n / t_ours:10.0f} tokens/s  ({t_ours * 1e3:.1f} ms)")
    print(f"forward transformers (torch):  {n / t_ref:10.0f} tokens/s  ({t_ref * 1e3:.1f} ms)")
    print(f"dense fp32 matmul rate: {rate / 1e9:.1f} GFLOP/s ({mm_n}^3 jnp matmul)")
    print(f"train step (SFT, AdamW):       {n / t_step:10.0f} tokens/s  ({t_step * 1e3:.1f} ms); "
          f"matmul bound {n / bound_s:,.0f} tokens/s (6 * params * tokens FLOPs)")
    print(f"load average {_load()}")
    print(f"forward ratio (ours / transformers): {t_ref / t_ours:.2f}x")
    print(f"train step / matmul bound: {100 * bound_s / t_step:.0f}%")


if __name__ == "__main__":
    main()
