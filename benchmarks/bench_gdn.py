"""The chunked gated delta rule's scan: Pallas kernel vs the `lax.scan` reference, side by side.

    python -m benchmarks.bench_gdn                       # 27B's GDN heads (16 key, 48 value, 128 dims)
    python -m benchmarks.bench_gdn --seq 8192 --batch 1
    JAX_PLATFORMS=cpu python -m benchmarks.bench_gdn --heads 2 --kheads 1 --dim 16 --seq 256  # interpret mode
    python -m benchmarks.bench_gdn --sweep 8,16 --stages 2,3 --warps 4,8   # the kernel alone per setting

Times `chunk_gated_delta_rule` forward (and forward + backward; the kernel's backward is the
reference scan's) for `impl="jax"` and `impl="pallas"` on the default backend, checks that the two
agree, and ends with `pallas / jax forward speed: N.NNx`. `--sweep` first times the scan alone
(kernel vs `lax.scan`, same inputs) for each value-column block, Triton pipeline depth and warp
count, printing the compile error of any that fails (shared memory), to choose the kernel's
defaults. On CPU the kernel runs in Pallas interpret mode, which checks it but says nothing of its
speed: measure on a GPU or TPU.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import os
import timeit

import jax
import jax.numpy as jnp
import numpy as np

from trsi_jax.models import gated_deltanet


def _best_of(fn, repeats: int) -> float:
    fn()  # compile
    return min(timeit.repeat(fn, number=1, repeat=repeats))


def sweep(args):
    """The scan alone: `chunk_scan` (jitted) vs `chunk_scan_pallas` per (block_v, num_stages, num_warps)."""
    from trsi_jax.models.kernels.gdn_pallas import chunk_scan_pallas

    b, h, d, c = args.batch, args.heads, args.dim, args.chunk
    n = args.seq // c
    keys = jax.random.split(jax.random.key(1), 6)
    small = lambda key, shape: 0.1 * jax.random.normal(key, shape)
    xs = (jnp.zeros((b, h, d, d)), small(keys[0], (n, b, h, c, d)), small(keys[1], (n, b, h, c, d)),
          jnp.tril(small(keys[2], (n, b, h, c, c))), small(keys[3], (n, b, h, c, d)),
          small(keys[4], (n, b, h, c, d)), jax.random.uniform(keys[5], (n, b, h), minval=0.5, maxval=1.0))
    ref = jax.jit(gated_deltanet.chunk_scan)
    want = jax.block_until_ready(ref(*xs))
    t_ref = _best_of(lambda: jax.block_until_ready(ref(*xs)), args.repeats)
    print(f"scan alone, lax.scan: {t_ref * 1e3:8.2f} ms")
    interpret = jax.default_backend() == "cpu"
    for bv in (int(x) for x in args.sweep.split(",")):
        for stages, warps in itertools.product(*(map(int, a.split(",")) for a in (args.stages, args.warps))):
            f = functools.partial(chunk_scan_pallas, interpret=interpret, block_v=bv, num_stages=stages,
                                  num_warps=warps)
            name = f"scan alone, pallas block_v={bv:3d} num_stages={stages} num_warps={warps}"
            try:
                got = jax.block_until_ready(f(*xs))
            except Exception as e:  # a config the compiler rejects (e.g. shared memory) is a result here
                print(f"{name}: failed: {str(e).strip().splitlines()[0][:160]}")
                continue
            t = _best_of(lambda: jax.block_until_ready(f(*xs)), args.repeats)
            rel = max(float(jnp.abs(x - y).max() / jnp.abs(x).max()) for x, y in zip(want, got))
            print(f"{name}: {t * 1e3:8.2f} ms ({t_ref / t:.2f}x lax.scan), max relative diff {rel:.1e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--kheads", type=int, default=16)
    p.add_argument("--heads", type=int, default=48, help="value heads")
    p.add_argument("--dim", type=int, default=128, help="key and value head dim")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--sweep", default="", help="value-column blocks to time the kernel alone at, e.g. 16,32")
    p.add_argument("--stages", default="1,2", help="Triton pipeline depths for --sweep")
    p.add_argument("--warps", default="4", help="Triton warps per program for --sweep")
    args = p.parse_args()
    jax.config.update("jax_default_matmul_precision", "highest")
    if args.sweep:
        sweep(args)

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
