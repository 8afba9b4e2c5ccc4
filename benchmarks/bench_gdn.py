"""The chunked gated delta rule's scan: Pallas kernel vs the `lax.scan` reference, side by side.

    python -m benchmarks.bench_gdn                       # 27B's GDN heads (16 key, 48 value, 128 dims)
    python -m benchmarks.bench_gdn --seq 8192 --batch 1
    JAX_PLATFORMS=cpu python -m benchmarks.bench_gdn --heads 2 --kheads 1 --dim 16 --seq 256  # interpret mode

Times `chunk_gated_delta_rule` forward (and forward + backward; the kernel's backward is the
reference scan's) for `impl="jax"` and `impl="pallas"` on the default backend, checks that the two
agree, and ends with `pallas / jax forward speed: N.NNx`. On CPU the kernel runs in Pallas
interpret mode, which checks it but says nothing of its speed: measure on a GPU or TPU.
"""
from __future__ import annotations

import argparse
import functools
import os
import timeit

import jax
import jax.numpy as jnp
import numpy as np

from trsi_jax.models import gated_deltanet


def _best_of(fn, repeats: int) -> float:
    fn()  # compile
    return min(timeit.repeat(fn, number=1, repeat=repeats))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--kheads", type=int, default=16)
    p.add_argument("--heads", type=int, default=48, help="value heads")
    p.add_argument("--dim", type=int, default=128, help="key and value head dim")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")

    keys = jax.random.split(jax.random.key(0), 5)
    b, t, hk, hv, d = args.batch, args.seq, args.kheads, args.heads, args.dim
    q = jax.random.normal(keys[0], (b, t, hk, d))
    k = jax.random.normal(keys[1], (b, t, hk, d))
    v = jax.random.normal(keys[2], (b, t, hv, d))
    g = -jax.nn.softplus(jax.random.normal(keys[3], (b, t, hv)))  # log decay <= 0
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (b, t, hv)))

    def fwd(impl):
        return jax.jit(functools.partial(gated_deltanet.chunk_gated_delta_rule, chunk=args.chunk, impl=impl))

    def grad(impl):
        def loss(v_):
            o, s = gated_deltanet.chunk_gated_delta_rule(q, k, v_, g, beta, chunk=args.chunk, impl=impl)
            return (o ** 2).mean() + s.mean()
        return jax.jit(jax.grad(loss))

    fwds = {impl: fwd(impl) for impl in ("jax", "pallas")}  # each compiled once, then timed
    out = {impl: f(q, k, v, g, beta) for impl, f in fwds.items()}
    diff = max(float(jnp.abs(a - b_).max()) for a, b_ in zip(out["jax"], out["pallas"]))
    scale = float(jnp.abs(out["jax"][0]).max())
    times = {}
    for impl in ("jax", "pallas"):
        f, gr = fwds[impl], grad(impl)
        times[impl] = (_best_of(lambda: jax.block_until_ready(f(q, k, v, g, beta)), args.repeats),
                       _best_of(lambda: jax.block_until_ready(gr(v)), args.repeats))
    tokens = b * t
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); batch={b} seq={t} key heads={hk} "
          f"value heads={hv} dim={d} chunk={args.chunk}; load average {os.getloadavg()[0]:.2f}")
    print(f"max |pallas - jax| = {diff:.2e} (outputs up to {scale:.2e})")
    for impl, (t_f, t_g) in times.items():
        print(f"{impl:7s} forward {t_f * 1e3:8.2f} ms ({tokens / t_f:12,.0f} tokens/s)   "
              f"forward+backward {t_g * 1e3:8.2f} ms")
    if jax.default_backend() == "cpu":
        print("(CPU: the kernel ran in Pallas interpret mode; its time is not a speed figure)")
    print(f"pallas / jax forward speed: {times['jax'][0] / times['pallas'][0]:.2f}x")
    np.testing.assert_allclose(out["pallas"][0], out["jax"][0], atol=1e-3 * max(scale, 1.0))


if __name__ == "__main__":
    main()
