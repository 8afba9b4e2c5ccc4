"""Reverse first-order linear recurrences, the kernel under every advantage estimator.

Solves x_t = b_t + a_t * x_{t+1} along the last axis with x_T = 0, i.e. composes the affine maps
f_t(x) = a_t x + b_t from the end. (a, b) = (1, 0) is the identity map, which is how estimators
skip positions for free. Several right-hand sides `bs` may share one coefficient array `a`
(solved together: the products of `a` are formed once).

Two exact formulations of the same recurrence (they differ only in float rounding order):
- "associative": `jax.lax.associative_scan` over affine maps, O(log T) depth.
- "sequential":  `jax.lax.scan`, one position per step (the textbook loop, compiled; unrolled).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def _compose(later, earlier):
    """Reverse composition f_t ∘ C_{t+1}: the later-in-time map (a1, b1) applies first."""
    a1, *b1 = later
    a2, *b2 = earlier
    return (a2 * a1, *(a2 * x1 + x2 for x1, x2 in zip(b1, b2)))


def reverse_linear_scan_associative(a, *bs):
    """x_t = b_t + a_t x_{t+1}, x_T = 0 for each b in bs, via a reverse associative scan."""
    _, *xs = jax.lax.associative_scan(_compose, (a, *bs), reverse=True, axis=a.ndim - 1)
    return tuple(xs)


# Loop steps per XLA while-iteration in the sequential forms: 8 cut TB-GAE's CPU time by ~35% at
# B=64, T=16k (1, 16, 32 and 64 were slower; measured with benchmarks/bench_gae.py's data).
SEQUENTIAL_UNROLL = 8


def reverse_linear_scan_sequential(a, *bs):
    """x_t = b_t + a_t x_{t+1}, x_T = 0 for each b in bs, one `lax.scan` step per position."""
    a_T = jnp.moveaxis(a, -1, 0)
    bs_T = tuple(jnp.moveaxis(b, -1, 0) for b in bs)

    def step(x_next, ab):
        a_t, b_t = ab
        x = tuple(b + a_t * xn for b, xn in zip(b_t, x_next))
        return x, x

    init = tuple(jnp.zeros_like(b[0]) for b in bs_T)
    _, xs_T = jax.lax.scan(step, init, (a_T, bs_T), reverse=True, unroll=SEQUENTIAL_UNROLL)
    return tuple(jnp.moveaxis(x, 0, -1) for x in xs_T)


SCAN_IMPLS = {
    "associative": reverse_linear_scan_associative,
    "sequential": reverse_linear_scan_sequential,
}


def resolve_impl(impl: str | None) -> str:
    """None -> the faster formulation for the default backend: on CPU "sequential" (TB-GAE at
    B=64, T=16k: 3.5x less CPU time than "associative", see benchmarks/bench_gae.py: the
    associative scan makes ~2 log2(T) strided slice/pad passes over the data on XLA:CPU);
    on GPU/TPU the log-depth "associative" scan."""
    if impl is None:
        return "sequential" if jax.default_backend() == "cpu" else "associative"
    if impl not in SCAN_IMPLS:
        raise ValueError(f"impl={impl!r} unknown; choose one of {sorted(SCAN_IMPLS)} or None (backend default)")
    return impl


def reverse_linear_scan(a, *bs, impl: str | None = None):
    """Dispatch to one of `SCAN_IMPLS` by name (static under jit); returns a tuple like bs."""
    return SCAN_IMPLS[resolve_impl(impl)](a, *bs)
