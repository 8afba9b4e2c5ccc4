"""Full (softmax) attention: GQA, QK-norm, partial RoPE, optional sigmoid output gate (qwen3_5)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax.config import ModelConfig
from trsi_jax.models.layers import RMSNorm, apply_rope, dense


def _scores(q_BKGtD, k_BKSD, bias_BtS):
    """Scaled fp32 logits [B, K, G, t, S] plus the additive mask (0 or the fp32 minimum)."""
    b, kv, g, t, d = q_BKGtD.shape
    logits = jnp.einsum("bkxd,bksd->bkxs", q_BKGtD.reshape(b, kv, g * t, d), k_BKSD,
                        preferred_element_type=jnp.float32) * (d ** -0.5)
    return logits.reshape(b, kv, g, t, -1) + bias_BtS[:, None, None]


@jax.custom_vjp
def _softmax_attention(q_BKGtD, k_BKSD, v_BKSD, bias_BtS):
    """softmax(q k^T / sqrt(d) + bias) v per (batch, kv head), query heads of a group stacked.

    Hand-written gradient: it recomputes the probabilities from the saved log-sum-exp (no
    [B, H, t, S] residual) and orders every product so that no [t, S]-sized array is transposed,
    which on XLA:CPU cost more than the matmuls themselves.
    """
    return _softmax_attention_fwd(q_BKGtD, k_BKSD, v_BKSD, bias_BtS)[0]


def _softmax_attention_fwd(q_BKGtD, k_BKSD, v_BKSD, bias_BtS):
    b, kv, g, t, d = q_BKGtD.shape
    s = _scores(q_BKGtD, k_BKSD, bias_BtS)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    # Normalise the [t, d] output rather than the [t, S] probabilities: one pass fewer over the logits.
    o = jnp.einsum("bkxs,bksd->bkxd", p.astype(v_BKSD.dtype).reshape(b, kv, g * t, -1), v_BKSD,
                   preferred_element_type=jnp.float32).reshape(b, kv, g, t, d)
    o = (o / l).astype(v_BKSD.dtype)
    return o, (q_BKGtD, k_BKSD, v_BKSD, bias_BtS, o, m + jnp.log(l))


def _softmax_attention_bwd(res, do_BKGtD):
    q, k, v, bias, o, lse = res
    b, kv, g, t, d = q.shape
    p = jnp.exp(_scores(q, k, bias) - lse)  # [B, K, G, t, S] fp32
    do_x = do_BKGtD.reshape(b, kv, g * t, d)
    dv = jnp.swapaxes(jnp.einsum("bkxd,bkxs->bkds", do_x, p.reshape(b, kv, g * t, -1).astype(v.dtype)), -1, -2)
    dp = jnp.einsum("bkxd,bksd->bkxs", do_x, v, preferred_element_type=jnp.float32).reshape(p.shape)
    delta = jnp.sum(do_BKGtD.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    ds = (p * (dp - delta) * (d ** -0.5)).reshape(b, kv, g * t, -1)
    dq = jnp.einsum("bkxs,bksd->bkxd", ds.astype(q.dtype), k).reshape(q.shape)
    dk = jnp.swapaxes(jnp.einsum("bkxd,bkxs->bkds", q.reshape(b, kv, g * t, d), ds.astype(q.dtype)), -1, -2)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), jnp.zeros_like(bias)


_softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)


MAX_SELF_BLOCKS = 32  # self-attention blocks are unrolled: beyond this, blocks grow instead


def attend(q_BTHD, k_BKSD, v_BKSD, valid_BS, slots_T, q_block: int = 128, self_keys: bool = False):
    """Softmax attention with grouped KV heads; logits and softmax in fp32.

    Keys and values are head-major ([B, Hkv, S, D], the KV cache's layout, so a decode step reads
    them without a transpose). Query t (at cache slot `slots_T[t]`) reads key slot s iff
    `valid_BS[:, s]` and s <= slots_T[t] (causality and padding). A query with no readable key (a
    left pad) gets a finite, meaningless output. Queries run in blocks of `q_block`, so the logits never exceed [B, H, q_block, S].
    `self_keys=True` promises the keys are the queries' own tokens (slots_T = arange(T), S = T):
    query block i then reads only keys [0, end of block i), which halves the work at long T. Small
    blocks skip more masked keys and keep each block's logits in cache (bench_profile, T=2048 on a
    2-core CPU: blocks of 128 took the forward's attention from 183 to 96 ms against 512); the
    unrolled self-key loop is capped at MAX_SELF_BLOCKS blocks, so very long T uses larger blocks
    rather than a longer program.
    """
    b, t, h, d = q_BTHD.shape
    kv, s = k_BKSD.shape[1], k_BKSD.shape[2]

    def block(q_BtHD, slots_t, keys: int = s):
        q_BKGtD = q_BtHD.reshape(b, -1, kv, h // kv, d).transpose(0, 2, 3, 1, 4)
        k_BKsD, v_BKsD = (x[:, :, :keys] for x in (k_BKSD, v_BKSD))
        allowed_Bts = valid_BS[:, None, :keys] & (jnp.arange(keys)[None, None, :] <= slots_t[None, :, None])
        bias_Bts = jnp.where(allowed_Bts, 0.0, jnp.finfo(jnp.float32).min)
        o_BKGtD = _softmax_attention(q_BKGtD, k_BKsD, v_BKsD, bias_Bts)
        return o_BKGtD.transpose(0, 3, 1, 2, 4).reshape(b, -1, h, d)

    if t <= q_block:
        return block(q_BTHD, slots_T)
    if self_keys:
        q_block = max(q_block, -(-t // (MAX_SELF_BLOCKS * q_block)) * q_block)
        return jnp.concatenate([block(q_BTHD[:, lo:lo + q_block], slots_T[lo:lo + q_block], keys=min(t, lo + q_block))
                                for lo in range(0, t, q_block)], axis=1)
    n = -(-t // q_block)
    pad = n * q_block - t
    q_NBtHD = jnp.pad(q_BTHD, [(0, 0), (0, pad), (0, 0), (0, 0)]).reshape(b, n, q_block, h, d).swapaxes(0, 1)
    slots_Nt = jnp.pad(slots_T, (0, pad)).reshape(n, q_block)
    out_NBtHD = jax.lax.map(lambda xs: block(*xs), (q_NBtHD, slots_Nt))
    return out_NBtHD.swapaxes(0, 1).reshape(b, n * q_block, h, d)[:, :t]


class Attention(nnx.Module):
    """Self-attention layer; with a KV cache it writes this call's keys/values at slot `length`."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # With the output gate, q_proj packs [q, gate] per head: columns [h, 2, d].
        self.q_proj = dense(cfg, cfg.hidden_size, h * d * (2 if cfg.attn_output_gate else 1), rngs)
        self.k_proj = dense(cfg, cfg.hidden_size, kv * d, rngs)
        self.v_proj = dense(cfg, cfg.hidden_size, kv * d, rngs)
        self.o_proj = dense(cfg, h * d, cfg.hidden_size, rngs)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_plus_one, cfg.param_dtype)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps, cfg.norm_plus_one, cfg.param_dtype)

    @jax.named_scope("attention")
    def __call__(self, x_BTD, cos_BTR, sin_BTR, valid_BS, slots_T, kv_cache=None):
        """Returns (out_BTD, (k_LBKSD, v_LBKSD) | None).

        kv_cache: None (keys are this call's tokens) or (k_LBKSD, v_LBKSD, layer, length): every
        full-attention layer's cache, stacked. This call's keys/values are written into layer
        `layer` at slots [length, length + T) before attending over all S slots. The stacked
        arrays go in and out whole, so a decode step writes its T slots in place instead of
        copying the cache (bench_sampler: 1.4x tokens/s at batch 32; the tiny model's step 2.8x).
        """
        cfg = self.cfg
        b, t, _ = x_BTD.shape
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q = self.q_proj(x_BTD)
        if cfg.attn_output_gate:
            q = q.reshape(b, t, h, 2 * d)
            q, gate_BTHD = q[..., :d], q[..., d:]
        else:
            q = q.reshape(b, t, h, d)
        k = self.k_norm(self.k_proj(x_BTD).reshape(b, t, kv, d))
        v = self.v_proj(x_BTD).reshape(b, t, kv, d)
        q = apply_rope(self.q_norm(q), cos_BTR, sin_BTR)
        k, v = (x.swapaxes(1, 2) for x in (apply_rope(k, cos_BTR, sin_BTR), v))  # [B, Hkv, T, D]
        new_cache = None
        if kv_cache is not None:
            k_all, v_all, layer, length = kv_cache
            at = (layer, 0, 0, length, 0)
            k_all = jax.lax.dynamic_update_slice(k_all, k[None].astype(k_all.dtype), at)
            v_all = jax.lax.dynamic_update_slice(v_all, v[None].astype(v_all.dtype), at)
            k, v = (jax.lax.dynamic_index_in_dim(a, layer, keepdims=False) for a in (k_all, v_all))
            new_cache = (k_all, v_all)
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), valid_BS, slots_T, q_block=cfg.attn_block,
                     self_keys=kv_cache is None)
        if cfg.attn_output_gate:
            out = out * jax.nn.sigmoid(gate_BTHD.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(out.reshape(b, t, h * d)), new_cache
