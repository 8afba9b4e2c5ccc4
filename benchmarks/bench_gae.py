"""TB-GAE speed: jitted formulations vs the PyTorch per-token loop, and vs the memcpy bound.

    .venv/bin/python benchmarks/bench_gae.py                      # B=64, T sweep 1k..16k
    .venv/bin/python benchmarks/bench_gae.py --B 64 --sweep 16384 --repeats 10

Everything is measured side by side in one run on the same batch (realistic multi-turn layout:
prompt, assistant turns, observations, padding; turn-end and final rewards). Columns:
- default: `rl.tb_gae(impl=None)`, the formulation `scan.resolve_impl` picks for the backend:
  on CPU "sequential" (the recurrence fused into one `lax.scan`, 8 tokens per loop iteration), elsewhere
  "associative" (two passes of reverse `lax.associative_scan` over affine maps);
- assoc / seq: `rl.tb_gae(impl="associative" | "sequential")` timed alongside (one is the default);
- scan1: the fused `lax.scan` with one token per loop iteration (the plain sequential version,
  without the unrolling the default uses);
- torch loop: the reverse per-token Python loop of common PyTorch RL libraries (vectorised over
  rows), extended with TB-GAE's observation skipping and turn pairs; CPU tensors, one repeat per
  size (its cost is the per-token Python overhead, so more repeats change little);
- memcpy: `np.copyto` of as many bytes as TB-GAE must move (4 inputs + 2 outputs, 4 B each).
All jitted results are checked against the torch loop before timing.
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import jax
import numpy as np
import torch

from trsi_jax import rl
from trsi_jax.rl.scan import resolve_impl

advantage = sys.modules["trsi_jax.rl.advantage"]

PAIRS = (1.0, 1.0, 0.99, 0.95)


def make_batch(B: int, T: int, seed: int = 0):
    """Rows of prompt (masked), assistant turns (policy) and observations (masked), then padding."""
    rng = np.random.default_rng(seed)
    r = np.zeros((B, T), np.float32)
    m = np.zeros((B, T), np.int32)
    k = np.full((B, T), -1, np.int32)
    for b in range(B):
        t, turn = int(rng.integers(50, 300)), 0
        end = T - int(rng.integers(0, T // 8))
        last = -1
        while t < end:
            n_pol = int(rng.integers(20, 300))
            m[b, t:min(t + n_pol, end)] = 1
            k[b, t:end] = turn
            last = min(t + n_pol, end) - 1
            r[b, last] = rng.normal(0, 0.1)  # dense per-turn reward on the turn's last token
            t += n_pol + int(rng.integers(20, 600))
            turn += 1
        r[b, last] += float(rng.random() < 0.5)  # outcome reward on the last policy token
    v = rng.normal(size=(B, T)).astype(np.float32)
    return r, v, m, k


def torch_tb_gae_loop(r, v, m, k, g_tok, l_tok, g_turn, l_turn):
    """Reverse per-token loop (the PyTorch-library style) with TB-GAE's skip and turn rules."""
    B, T = r.shape
    adv = torch.zeros_like(r)
    a_next, v_next, r_pend = torch.zeros(B), torch.zeros(B), torch.zeros(B)
    k_next = torch.full((B,), -1, dtype=k.dtype)
    first = torch.full((B,), -1, dtype=torch.long)
    pol_all = m > 0
    for t in reversed(range(T)):
        pol = pol_all[:, t]
        same = k_next == k[:, t]
        g = torch.where(same, g_tok, g_turn)
        lam = torch.where(same, l_tok, l_turn)
        a_t = r[:, t] + r_pend + g * v_next - v[:, t] + g * lam * a_next
        adv[:, t] = torch.where(pol, a_t, 0.0)
        a_next = torch.where(pol, a_t, a_next)
        v_next = torch.where(pol, v[:, t], v_next)
        k_next = torch.where(pol, k[:, t], k_next)
        r_pend = torch.where(pol, 0.0, r_pend + r[:, t])
        first = torch.where(pol, t, first)
    rows = torch.nonzero(first >= 0).squeeze(1)
    adv[rows, first[rows]] += r_pend[rows]  # rewards before the first policy token
    return adv, (adv + v) * pol_all


def best_times(fns: dict, repeats: int, clock) -> dict:
    """Best time of each callable, repeats interleaved so load changes hit all alike."""
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            best[name] = min(best[name], clock() - t0)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=64)
    p.add_argument("--sweep", default="1024,2048,4096,8192,16384", help="comma-separated T values")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu = process CPU time (all threads): steadier on a machine shared with other jobs")
    args = p.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    B, default = args.B, resolve_impl(None)
    print(f"backend={jax.default_backend()} torch_threads={torch.get_num_threads()} B={B} clock={args.clock} "
          f"repeats={args.repeats} (torch loop: 1) load_avg={os.getloadavg()[0]:.1f} default impl={default}")
    head = (f"{'T':>6} {'default':>9} {'scan1':>9} {'assoc':>9} {'seq':>9} {'torch':>8} {'memcpy':>8} | "
            f"{'torch/def':>9} {'scan1/def':>9} {'assoc/def':>9} {'def/memcpy':>10}")
    print(head + "\n" + "-" * len(head))
    scan1 = jax.jit(functools.partial(advantage._tb_gae_fused_loop, unroll=1))
    for T in (int(x) for x in args.sweep.split(",")):
        r, v, m, k = make_batch(B, T)
        rt, vt, mt, kt = (torch.from_numpy(x) for x in (r, v, m, k))
        t0 = clock()
        ref_adv, _ = torch_tb_gae_loop(rt, vt, mt, kt, *PAIRS)
        t_torch = clock() - t0
        xs = [jax.device_put(x) for x in (r, v, m, k)]
        xs_f = [jax.device_put(x.astype(np.float32)) for x in (r, v, m, k)]
        fns = {name: functools.partial(lambda impl: jax.block_until_ready(
                   rl.tb_gae(*xs, *PAIRS, impl=impl, validate=False)), impl)
               for name, impl in (("default", None), ("assoc", "associative"), ("seq", "sequential"))}
        fns["scan1"] = lambda: jax.block_until_ready(scan1(*xs_f, *PAIRS))
        for name, fn in fns.items():  # compile, and check against the torch loop
            out = fn()
            adv = np.asarray(out[0] if isinstance(out, tuple) else out)
            err, scale = np.abs(adv - ref_adv.numpy()).max(), np.abs(ref_adv.numpy()).max()
            assert err <= 1e-5 * max(1.0, scale), f"{name} T={T}: max |diff| vs torch loop {err}"
        nbytes = sum(x.nbytes for x in (r, v, m, k)) + 2 * r.nbytes
        src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        fns["memcpy"] = lambda: np.copyto(dst, src)
        t = best_times(fns, args.repeats, clock)
        d = t["default"]
        print(f"{T:>6} " + " ".join(f"{t[n] * 1e3:>7.2f}ms" for n in ("default", "scan1", "assoc", "seq")) +
              f" {t_torch * 1e3:>6.0f}ms {t['memcpy'] * 1e3:>6.2f}ms | {t_torch / d:>8.1f}x {t['scan1'] / d:>8.2f}x "
              f"{t['assoc'] / d:>8.2f}x {d / t['memcpy']:>9.1f}x")
    print("x/def > 1: the default is that many times faster than x; def/memcpy: the default's time over the "
          "time to copy its bytes (1.0 = memory-bandwidth bound). scan1 = the fused lax.scan with one token "
          "per loop iteration (no unrolling).")


if __name__ == "__main__":
    main()
