"""Decode throughput: the JAX sampler vs transformers `generate` (torch, KV cache), same weights.

A small random `qwen3_5` model is built in transformers, saved, and loaded into JAX with
`load_hf`; both generate greedily for a batch of 8 prompts with no stop token, so both produce
exactly batch * new_tokens tokens. Compilation / warm-up runs are excluded from the timings.

    python -m benchmarks.bench_sampler [--new_tokens=128 --prompt_len=64 --batch=8 --repeats=3]
"""
from __future__ import annotations

import os
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 8, "prompts per batch")
flags.DEFINE_integer("prompt_len", 64, "prompt tokens")
flags.DEFINE_integer("new_tokens", 128, "tokens generated per prompt")
flags.DEFINE_integer("repeats", 3, "timed runs (best is reported)")
flags.DEFINE_integer("hidden", 256, "hidden size of the benchmark model")
flags.DEFINE_integer("layers", 4, "layers (every 4th full attention)")
flags.DEFINE_integer("torch_threads", 0, "torch intra-op threads (0 = all cores; 1 is faster on a busy machine)")


def build_hf_model(path: str):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    h = FLAGS.hidden
    cfg = Qwen3_5TextConfig(
        vocab_size=4096, hidden_size=h, num_hidden_layers=FLAGS.layers, intermediate_size=2 * h,
        num_attention_heads=4, num_key_value_heads=2, head_dim=h // 4, linear_num_key_heads=4,
        linear_num_value_heads=8, linear_key_head_dim=h // 8, linear_value_head_dim=h // 8,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    model = Qwen3_5ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return model


def best_of(fn) -> float:
    times = []
    for _ in range(FLAGS.repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv):
    del argv
    import jax
    import numpy as np
    import torch

    from trsi_jax.models import load_hf
    from trsi_jax.rollout.sampler import SampleConfig, Sampler

    B, T, N = FLAGS.batch, FLAGS.prompt_len, FLAGS.new_tokens
    prompts = np.random.default_rng(0).integers(0, 4096, (B, T))
    with tempfile.TemporaryDirectory() as path:
        hf = build_hf_model(path)
        model = load_hf(path)

    sampler = Sampler(model, max_len=T + N)
    cfg = SampleConfig(temperature=0.0, max_new_tokens=N)
    run_jax = lambda: sampler.generate(prompts.tolist(), cfg, jax.random.key(0))  # noqa: E731
    jax_out = run_jax()  # compile
    assert all(len(t) == N for t, _ in jax_out)
    jax_sec = best_of(run_jax)

    torch.set_num_threads(FLAGS.torch_threads or os.cpu_count() or 1)
    ids = torch.as_tensor(prompts)
    gen_kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False, use_cache=True, eos_token_id=None,
                  pad_token_id=0, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        run_torch = lambda: hf.generate(ids, **gen_kw)  # noqa: E731
        torch_out = run_torch()  # warm-up
        torch_sec = best_of(run_torch)

    agree = np.mean(np.asarray([t for t, _ in jax_out]) == torch_out[:, T:].numpy())
    jax_tps, torch_tps = B * N / jax_sec, B * N / torch_sec
    print(f"model: qwen3_5 hidden={FLAGS.hidden} layers={FLAGS.layers}; batch={B} prompt={T} new={N}; "
          f"jax on {jax.devices()[0].platform}, torch on cpu ({torch.get_num_threads()} threads)")
    print(f"jax sampler (prefill + decode):       {jax_tps:9.1f} tokens/s  ({jax_sec:.3f} s)")
    print(f"transformers generate (KV cache):     {torch_tps:9.1f} tokens/s  ({torch_sec:.3f} s)")
    print(f"ratio jax / transformers:             {jax_tps / torch_tps:9.2f}x")
    print(f"greedy tokens identical:              {agree:9.1%}")


if __name__ == "__main__":
    app.run(main)
