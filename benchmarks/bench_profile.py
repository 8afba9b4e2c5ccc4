"""Where the time goes: forward, SFT step and PPO policy step, split by model component.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_profile.py                 # bench config, T=512
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_profile.py --seq 2048
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_profile.py --preset tiny --seq 3072   # demo SFT

Runs each program under `jax.profiler`, takes the self time of every executed XLA op (thunk)
from the trace, maps the op to its `jax.named_scope` (the model code labels gdn_intra,
gdn_solve, gdn_scan, gdn_proj, attention, mlp, norm, lm_head, loss, optimizer; the innermost
label wins, backward ops keep their forward label) and prints each component's share. Shares
are of summed op time, which on 2 cores can exceed wall time; wall time is printed too. Under
load (see the printed load average) absolute times inflate, shares much less.
"""
from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trsi_jax.config import ModelConfig, OptimConfig, PPOConfig, model_preset
from trsi_jax.models import Qwen
from trsi_jax.models.qwen import Critic
from trsi_jax.train import sft
from trsi_jax.train.optim import make_optimizer
from trsi_jax.train import ppo
from trsi_jax.train.ppo import BATCH_KEYS, PPOLearner

SCOPES = ("gdn_intra", "gdn_solve", "gdn_scan", "gdn_proj", "attention", "mlp", "norm", "lm_head", "loss",
          "optimizer")
_OP = re.compile(r'\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{op_name="([^"]*)"')


def bench_config(hidden: int, layers: int) -> ModelConfig:
    """bench_model's architecture (heads of 64, GQA 2:1, FFN 2x hidden) in native form."""
    heads = max(hidden // 64, 2)
    return ModelConfig(vocab_size=1024, hidden_size=hidden, num_layers=layers, intermediate_size=2 * hidden,
                       num_heads=heads, num_kv_heads=heads // 2, head_dim=64, linear_num_key_heads=heads // 2,
                       linear_num_value_heads=heads, linear_key_head_dim=64, linear_value_head_dim=64)


def _category(op_name: str) -> str:
    """The innermost known scope in an op's name stack, else 'other'."""
    best, pos = "other", -1
    for s in SCOPES:  # as a whole name: "mlp/dot", "transpose(jvp(loss))/mul"
        for m in re.finditer(rf"(?<![\w]){s}(?![\w])", op_name):
            if m.start() > pos:
                best, pos = s, m.start()
    return best


def _self_times(events: list[dict]) -> collections.Counter:
    """Per event name: duration minus the durations of events nested inside it on its thread."""
    out = collections.Counter()
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for evs in by_thread.values():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[list] = []  # [end, name, child time]
        for e in evs:
            start, dur = e["ts"], e.get("dur", 0)
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                stack[-1][2] += dur
            stack.append([start + dur, e["name"], 0.0])
            e["_frame"] = stack[-1]
        for e in evs:
            out[e["name"]] += e.get("dur", 0) - e["_frame"][2]
    return out


def profile(fn, args, repeats: int) -> tuple[dict[str, float], float]:
    """(ms per call by component, wall ms per call) of the jitted `fn(*args)`."""
    names = {}
    for line in fn.lower(*args).compile().as_text().splitlines():
        m = _OP.match(line)
        if m:
            names[m.group(1)] = _category(m.group(2))
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        t0 = time.perf_counter()
        for _ in range(repeats):
            jax.block_until_ready(fn(*args))
        wall = (time.perf_counter() - t0) / repeats
        jax.profiler.stop_trace()
        trace = json.load(gzip.open(glob.glob(f"{tmp}/**/*perfetto_trace.json.gz", recursive=True)[0]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    per = collections.Counter()
    for name, us in _self_times(events).items():
        if name in names:
            per[names[name]] += us / 1e3 / repeats
    return dict(per), wall * 1e3


def _report(title: str, per: dict[str, float], wall_ms: float, tokens: int) -> None:
    total = sum(per.values())
    gdn = sum(v for k, v in per.items() if k.startswith("gdn_"))
    print(f"\n{title}: wall {wall_ms:.1f} ms ({tokens / wall_ms * 1e3:,.0f} tokens/s), op time {total:.1f} ms; "
          f"Gated DeltaNet total {100 * gdn / max(total, 1e-9):.0f}%")
    for k in sorted(per, key=per.get, reverse=True):
        print(f"  {k:10s} {per[k]:9.1f} ms  {100 * per[k] / max(total, 1e-9):5.1f}%")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="", help="a MODEL_PRESETS name instead of the bench config (e.g. tiny)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--programs", default="forward,sft,ppo")
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    cfg = model_preset(args.preset) if args.preset else bench_config(args.hidden, args.layers)
    print(f"config: {args.preset or 'bench'} hidden={cfg.hidden_size} layers={cfg.num_layers} "
          f"seq={args.seq} batch={args.batch} chunk={cfg.gdn_chunk_size} fp32; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, args.seq)), jnp.int32)
    ones = jnp.ones_like(tokens)
    n = tokens.size
    model = Qwen(cfg, rngs=nnx.Rngs(0))
    programs = args.programs.split(",")
    if "forward" in programs:
        graphdef, state = nnx.split(model)
        fwd = jax.jit(lambda st, x: nnx.merge(graphdef, st)(x))
        _report("forward", *profile(fwd, (state, tokens), args.repeats), n)
    if "sft" in programs:
        tx = make_optimizer(OptimConfig(lr=1e-3))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        step = jax.jit(lambda pa, re_, o, b: sft._train_step(graphdef, tx, pa, re_, o, b))
        batch = {"tokens_BT": tokens, "mask_BT": ones, "loss_mask_BT": ones}
        _report("SFT step", *profile(step, (params, rest, tx.init(params), batch), args.repeats), n)
    if "ppo" in programs:
        learner = PPOLearner(model, Critic.from_policy(model), PPOConfig(minibatch_size=args.batch),
                             OptimConfig(lr=1e-6), OptimConfig(lr=1e-6), sft.default_mesh())
        mb = {k: (tokens if k == "tokens" else ones if "mask" in k else jnp.zeros(tokens.shape, jnp.float32))
              for k in BATCH_KEYS}
        mb = learner._put({k: np.asarray(v) for k, v in mb.items()})
        args_ = (learner.policy_params, learner.policy_rest, learner.policy_opt, mb)
        step = jax.jit(functools.partial(ppo._step, learner._policy_loss, learner.policy_tx, "policy"))  # no donation
        _report("PPO policy step", *profile(step, args_, args.repeats), n)


if __name__ == "__main__":
    main()
