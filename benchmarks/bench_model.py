"""Forward throughput: the Flax Qwen3.5 port (jitted) vs `transformers` (torch, CPU), same weights.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_model.py            # 4 layers, hidden 256, T=512, B=4
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_model.py --seq 2048

Builds a random Qwen3_5ForCausalLM, saves it, imports it with `load_hf`, checks the logits agree,
then times both side by side and prints tokens/s and the ratio (ours / reference).
"""
from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from trsi_jax.models import load_hf


def _best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")

    torch.manual_seed(0)
    heads = max(args.hidden // 64, 2)
    hf_cfg = Qwen3_5TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
        intermediate_size=2 * args.hidden, num_attention_heads=heads, num_key_value_heads=heads // 2,
        head_dim=64, linear_num_key_heads=heads // 2, linear_num_value_heads=heads,
        linear_key_head_dim=64, linear_value_head_dim=64, attn_implementation="sdpa")
    ref = Qwen3_5ForCausalLM(hf_cfg).eval()
    with tempfile.TemporaryDirectory() as tmp:
        ref.save_pretrained(tmp)
        model = load_hf(tmp)

    tokens = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq))
    tokens_jax, tokens_pt = jnp.asarray(tokens), torch.tensor(tokens)
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
    t0 = time.perf_counter()
    ours = np.asarray(forward(state, tokens_jax))
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        theirs = ref(input_ids=tokens_pt).logits.numpy()
    diff = float(np.abs(ours - theirs).max())

    t_ours = _best_of(lambda: forward(state, tokens_jax).block_until_ready(), args.repeats)

    def run_ref():
        with torch.no_grad():
            ref(input_ids=tokens_pt)

    t_ref = _best_of(run_ref, args.repeats)
    n = args.batch * args.seq
    print(f"config: layers={args.layers} hidden={args.hidden} seq={args.seq} batch={args.batch} "
          f"vocab={args.vocab} (fp32, CPU, torch threads={torch.get_num_threads()})")
    print(f"max |logits diff| = {diff:.2e}; jax compile {compile_s:.1f}s")
    print(f"trsi_jax (jit):        {n / t_ours:10.0f} tokens/s  ({t_ours * 1e3:.1f} ms)")
    print(f"transformers (torch):  {n / t_ref:10.0f} tokens/s  ({t_ref * 1e3:.1f} ms)")
    print(f"ratio (ours / reference): {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()
