"""Gated delta rule, pure functions: chunked (WY form, training/prefill) and recurrent (decode).

Per value head, with state S [Dk, Dv], decay g_t <= 0 (log space), write strength beta_t in
(0, 1), L2-normalised key k_t and query q_t (scaled by Dk^-1/2):

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T q_t

All math here is fp32. Value head h reads key head h // (Hv / Hk).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def l2norm(x, eps: float = 1e-6):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(q_BTKD, k_BTKD, v_BTHV, g_BTH, beta_BTH):
    """fp32, key heads repeated to value heads, q/k L2-normalised, q scaled."""
    groups = v_BTHV.shape[2] // q_BTKD.shape[2]
    q, k = (jnp.repeat(l2norm(x.astype(jnp.float32)), groups, axis=2) for x in (q_BTKD, k_BTKD))
    q = q * (q.shape[-1] ** -0.5)
    return q, k, v_BTHV.astype(jnp.float32), g_BTH.astype(jnp.float32), beta_BTH.astype(jnp.float32)


def recurrent_gated_delta_rule(q_BTKD, k_BTKD, v_BTHV, g_BTH, beta_BTH, state_BHDV=None):
    """Token-by-token reference/decode form. Returns (o_BTHV fp32, final state_BHDV fp32)."""
    q, k, v, g, beta = _prepare(q_BTKD, k_BTKD, v_BTHV, g_BTH, beta_BTH)
    b, _, h, dk = k.shape
    if state_BHDV is None:
        state_BHDV = jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)

    def step(s_BHDV, xs):
        q_t, k_t, v_t, g_t, beta_t = xs
        s_BHDV = s_BHDV * jnp.exp(g_t)[..., None, None]
        pred_BHV = jnp.einsum("bhdv,bhd->bhv", s_BHDV, k_t)
        delta_BHV = (v_t - pred_BHV) * beta_t[..., None]
        s_BHDV = s_BHDV + k_t[..., :, None] * delta_BHV[..., None, :]
        return s_BHDV, jnp.einsum("bhdv,bhd->bhv", s_BHDV, q_t)

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta))
    state, o_TBHV = jax.lax.scan(step, state_BHDV.astype(jnp.float32), xs)
    return jnp.moveaxis(o_TBHV, 0, 1), state


def unit_lower_inverse(a_XCC):
    """(I + A)^-1 for strictly lower-triangular A [..., C, C], C a power of two.

    Blocked forward substitution by doubling: the inverse of [[X, 0], [A21, Y]] (X, Y unit lower,
    inverses known) is [[X^-1, 0], [-Y^-1 A21 X^-1, Y^-1]]. log2(C) rounds of batched matmuls;
    XLA:CPU's batched triangular_solve is ~100x slower at these shapes, and its gradient too.
    """
    c = a_XCC.shape[-1]
    if c & (c - 1):
        raise ValueError(f"unit_lower_inverse needs a power-of-two size, got {c}; set gdn_chunk_size to 2^k")
    lead = a_XCC.shape[:-2]
    inv_XNss = jnp.ones(lead + (c, 1, 1), a_XCC.dtype)  # inverses of the 1x1 diagonal blocks
    s = 1
    while s < c:
        n = c // (2 * s)
        x, y = inv_XNss[..., 0::2, :, :], inv_XNss[..., 1::2, :, :]
        # Off-diagonal block A21 of each of the n diagonal 2s-blocks.
        diag_X22N = jnp.diagonal(a_XCC.reshape(lead + (n, 2 * s, n, 2 * s)), axis1=-4, axis2=-2)
        a21 = jnp.moveaxis(diag_X22N, -1, -3)[..., s:, :s]
        top = jnp.concatenate([x, jnp.zeros_like(x)], axis=-1)
        bottom = jnp.concatenate([-(y @ a21 @ x), y], axis=-1)
        inv_XNss = jnp.concatenate([top, bottom], axis=-2)
        s *= 2
    return inv_XNss[..., 0, :, :]


def chunk_scan(state_BHDV, u_NBHCV, w_NBHCD, intra_NBHCC, q_decayed_NBHCD, k_to_end_NBHCD, chunk_decay_NBH):
    """The sequential part of the chunked form: (final state, o_NBHCV) by a scan over chunks."""

    def step(s_BHDV, xs):
        u, w, intra, qd, ke, cd = xs
        v_new = u - w @ s_BHDV
        o = qd @ s_BHDV + intra @ v_new
        s_BHDV = s_BHDV * cd[..., None, None] + jnp.swapaxes(ke, -1, -2) @ v_new
        return s_BHDV, o

    return jax.lax.scan(step, state_BHDV, (u_NBHCV, w_NBHCD, intra_NBHCC, q_decayed_NBHCD, k_to_end_NBHCD,
                                           chunk_decay_NBH))


@jax.custom_vjp
def _chunk_scan_pallas(*args):
    from trsi_jax.models.kernels.gdn_pallas import chunk_scan_pallas

    return chunk_scan_pallas(*args, interpret=jax.default_backend() == "cpu")


def _chunk_scan_pallas_fwd(*args):
    return _chunk_scan_pallas(*args), args


def _chunk_scan_pallas_bwd(args, cotangents):  # gradient of the reference scan (recomputed)
    return jax.vjp(chunk_scan, *args)[1](cotangents)


_chunk_scan_pallas.defvjp(_chunk_scan_pallas_fwd, _chunk_scan_pallas_bwd)
CHUNK_SCANS = {"jax": chunk_scan, "pallas": _chunk_scan_pallas}


def chunk_gated_delta_rule(q_BTKD, k_BTKD, v_BTHV, g_BTH, beta_BTH, state_BHDV=None, chunk: int = 64,
                           impl: str = "jax"):
    """Chunked WY form: within a chunk the C delta updates collapse into a unit lower-triangular
    solve plus matmuls; a scan carries the fp32 state across chunks. Any T (padded internally
    with g = 0, beta = 0, k = 0, which leaves the state unchanged). Same returns as the recurrent form.
    `impl="pallas"` runs the scan as a Pallas kernel (GPU/TPU; interpret mode on CPU), whose
    gradient is the JAX scan's.
    """
    if impl not in CHUNK_SCANS:
        raise ValueError(f"gdn impl must be one of {sorted(CHUNK_SCANS)}, got {impl!r}")
    q, k, v, g, beta = _prepare(q_BTKD, k_BTKD, v_BTHV, g_BTH, beta_BTH)
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    if state_BHDV is None:
        state_BHDV = jnp.zeros((b, h, dk, dv), jnp.float32)
    n = -(-t // chunk)
    pad = n * chunk - t

    def chunked(x):  # [B, T, H, ...] -> [N, B, H, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, chunk, *x.shape[2:])
        return jnp.moveaxis(jnp.moveaxis(x, 1, 0), 3, 2)

    with jax.named_scope("gdn_intra"):
        q, k, v, g, beta = (chunked(x) for x in (q, k, v, g, beta))
        gc_NBHC = jnp.cumsum(g, axis=-1)  # log decay from chunk start to each position
        lower = jnp.tril(jnp.ones((chunk, chunk), bool))
        # decay_ij = exp(gc_i - gc_j) for j <= i, else 0 (masked before exp to avoid overflow).
        diff = gc_NBHC[..., :, None] - gc_NBHC[..., None, :]
        decay_NBHCC = jnp.exp(jnp.where(lower, diff, -jnp.inf))
        k_beta = k * beta[..., None]
        # Unit lower-triangular system (I + A), A = strictly lower part of (beta k) k^T * decay.
        a_NBHCC = jnp.where(lower & ~jnp.eye(chunk, dtype=bool), k_beta @ jnp.swapaxes(k, -1, -2) * decay_NBHCC, 0.0)
        intra_NBHCC = q @ jnp.swapaxes(k, -1, -2) * decay_NBHCC
        q_decayed = q * jnp.exp(gc_NBHC)[..., None]
        k_to_end = k * jnp.exp(gc_NBHC[..., -1:] - gc_NBHC)[..., None]
        chunk_decay_NBH = jnp.exp(gc_NBHC[..., -1])
    with jax.named_scope("gdn_solve"):
        inv_NBHCC = unit_lower_inverse(a_NBHCC)
        u_NBHCV = inv_NBHCC @ (v * beta[..., None])
        w_NBHCD = inv_NBHCC @ (k_beta * jnp.exp(gc_NBHC)[..., None])

    with jax.named_scope("gdn_scan"):
        state, o_NBHCV = CHUNK_SCANS[impl](state_BHDV.astype(jnp.float32), u_NBHCV, w_NBHCD, intra_NBHCC,
                                           q_decayed, k_to_end, chunk_decay_NBH)
        o_BTHV = jnp.moveaxis(o_NBHCV, 0, 1)  # [B, N, H, C, V]
        o_BTHV = jnp.swapaxes(o_BTHV, 2, 3).reshape(b, n * chunk, h, dv)[:, :t]
    return o_BTHV, state


def causal_conv1d(x_BTC, w_KC, prefix_BKC=None, left_pads_B=None):
    """Depthwise causal conv + SiLU. `prefix_BKC` holds the K-1 inputs before x (zeros if None).
    `left_pads_B`: x's rows start with that many (zero) pads, e.g. a left-padded continuation of a
    cached sequence: each row's prefix moves to just before its first real input, so no window
    mixes pads in between.

    Returns (y_BTC, new prefix = last K-1 inputs of [prefix, x] after that move).
    """
    kk = w_KC.shape[0]
    if prefix_BKC is None:
        prefix_BKC = jnp.zeros((x_BTC.shape[0], kk - 1, x_BTC.shape[2]), x_BTC.dtype)
    xx = jnp.concatenate([prefix_BKC.astype(x_BTC.dtype), x_BTC], axis=1)
    t = x_BTC.shape[1]
    if left_pads_B is not None:  # [prefix, pads, x] -> [pads, prefix, x], per row
        i_S, p_B1 = jnp.arange(kk - 1 + t), left_pads_B[:, None]
        src_BS = jnp.where(i_S < p_B1, i_S + kk - 1, jnp.where(i_S < p_B1 + kk - 1, i_S - p_B1, i_S))
        xx = jnp.take_along_axis(xx, src_BS[..., None], axis=1)
    y = sum(xx[:, j:j + t].astype(jnp.float32) * w_KC[j].astype(jnp.float32) for j in range(kk))
    return jax.nn.silu(y).astype(x_BTC.dtype), xx[:, t:]
