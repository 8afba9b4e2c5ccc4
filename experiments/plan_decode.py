"""Ahead-of-time plan of one batched decode step (rollout sampling) on a mesh this machine lacks.

    python -m experiments.plan_decode --model=qwen3_8_27b --mesh=tensor=4 --batch=64 --seq_len=8192 --chip=v6e

The step (`Qwen.decode_step`: one token per row against a full-length cache, greedy pick) is
compiled for N fake CPU devices with bf16 weights (serving needs no fp32 master copy) and the
decode cache sharded by `sharding.CACHE_RULES`. Reports per-device weights, cache and XLA
temporaries, and the HBM-bandwidth bound: a decode step reads every weight shard and the whole
cache once, so step >= bytes per device / HBM bandwidth and tokens/s per chip <= batch / step / N.
Flags are plan.py's: --model, --mesh, --batch (sequences), --seq_len (cache length), --chip.
"""
from __future__ import annotations


if __name__ == "__main__":  # the fake device count must be set before jax is imported
    from experiments import fake_devices

    fake_devices.from_argv()

import dataclasses  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from experiments import common  # noqa: E402
from experiments.plan import CHIPS, GB, parse_mesh, per_device_bytes  # noqa: E402
from trsi_jax import sharding as sharding_lib  # noqa: E402
from trsi_jax.config import ModelConfig  # noqa: E402

# HBM bandwidth per chip, GB/s (vendor figures).
HBM_GBPS = {"v4": 1228, "v5e": 819, "v5p": 2765, "v6e": 1640, "a100": 2039, "h100": 3350, "h200": 4800,
            "b200": 8000}


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    devices: int
    batch: int
    weight_bytes: int  # per device
    cache_bytes: int  # per device
    temp_bytes: int  # XLA temporaries per device
    compile_s: float

    def step_seconds(self, hbm_gbps: float) -> float:
        """HBM-bound lower bound: every weight shard and cache byte read once per step."""
        return (self.weight_bytes + self.cache_bytes) / (hbm_gbps * GB)

    def tokens_per_sec_per_chip(self, hbm_gbps: float) -> float:
        return self.batch / self.step_seconds(hbm_gbps) / self.devices


def decode_plan(cfg: ModelConfig, mesh, batch: int, context: int) -> DecodePlan:
    """Compiles `decode_step` for `batch` rows with a `context`-token cache on `mesh`."""
    from trsi_jax.models import Qwen, init_cache

    with jax.set_mesh(mesh):
        graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
        p_sh = sharding_lib.param_shardings(params, mesh)
        params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), params, p_sh)
        cache = jax.eval_shape(functools.partial(init_cache, cfg, batch, context))
        c_sh = sharding_lib.cache_shardings(cache, mesh)
        cache = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), cache, c_sh)
        tokens = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=sharding_lib.batch_sharding(mesh, 1))

        def step(params, tokens_B, cache):
            logits_BV, cache = nnx.merge(graphdef, params, rest).decode_step(tokens_B, cache)
            return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32), cache

        start = time.perf_counter()
        compiled = jax.jit(step, out_shardings=(tokens.sharding, c_sh), donate_argnums=(2,)).lower(
            params, tokens, cache).compile()
        compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    return DecodePlan(devices=mesh.size, batch=batch, weight_bytes=per_device_bytes(params),
                      cache_bytes=per_device_bytes(cache), temp_bytes=mem.temp_size_in_bytes, compile_s=compile_s)


FLAGS = flags.FLAGS


def main(argv):
    del argv
    if FLAGS.chip not in HBM_GBPS:
        raise app.UsageError(f"--chip={FLAGS.chip!r} unknown; choose {sorted(HBM_GBPS)}")
    base = common.model_config_from_flags()
    cfg = dataclasses.replace(base, param_dtype=base.dtype, remat="none")  # serving: bf16 weights, no remat
    cfg = common.config_from_flags("model_cfg", cfg)
    mesh = sharding_lib.make_mesh(parse_mesh(FLAGS.mesh))
    plan = decode_plan(cfg, mesh, FLAGS.batch, FLAGS.seq_len)
    bw, hbm = HBM_GBPS[FLAGS.chip], CHIPS[FLAGS.chip].hbm_gb
    resident = plan.weight_bytes + plan.cache_bytes
    print(f"decode plan: model={FLAGS.model} mesh={dict(mesh.shape)} batch={FLAGS.batch} context={FLAGS.seq_len} "
          f"weights={cfg.param_dtype} (compiled in {plan.compile_s:.0f} s)\n"
          f"  per device: weights {plan.weight_bytes / GB:.2f} GB + cache {plan.cache_bytes / GB:.2f} GB = "
          f"{resident / GB:.2f} of {hbm:g} GB on {FLAGS.chip}: " + ("fits" if resident <= hbm * GB else "DOES NOT FIT")
          + f"; XLA:CPU temporaries {plan.temp_bytes / GB:.2f} GB (XLA:CPU runs bf16 dots in fp32:"
          " an upper bound)\n"
          f"  HBM-bound ({bw} GB/s): step >= {plan.step_seconds(bw) * 1e3:.1f} ms, "
          f"<= {plan.tokens_per_sec_per_chip(bw):.0f} tokens/s per chip")


if __name__ == "__main__":
    app.run(main)
