"""Full (softmax) attention: GQA, QK-norm, partial RoPE, optional sigmoid output gate (qwen3_5)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax.config import ModelConfig
from trsi_jax.models.layers import RMSNorm, apply_rope, dense


def attend(q_BTHD, k_BSKD, v_BSKD, valid_BS, slots_T, q_block: int = 512, self_keys: bool = False):
    """Softmax attention with grouped KV heads; logits and softmax in fp32.

    Query t (at cache slot `slots_T[t]`) reads key slot s iff `valid_BS[:, s]` and s <= slots_T[t]
    (causality and padding). A query with no readable key (a left pad) gets a finite, meaningless
    output. Queries run in blocks of `q_block`, so the logits never exceed [B, H, q_block, S].
    `self_keys=True` promises the keys are the queries' own tokens (slots_T = arange(T), S = T):
    query block i then reads only keys [0, end of block i), which halves the work at long T.
    """
    b, t, h, d = q_BTHD.shape
    s, kv = k_BSKD.shape[1], k_BSKD.shape[2]

    def block(q_BtHD, slots_t, keys: int = s):
        q_BtKGD = q_BtHD.reshape(b, -1, kv, h // kv, d)
        k_BsKD, v_BsKD = k_BSKD[:, :keys], v_BSKD[:, :keys]
        logits = jnp.einsum("btkgd,bskd->bkgts", q_BtKGD, k_BsKD, preferred_element_type=jnp.float32) * (d ** -0.5)
        allowed_Bts = valid_BS[:, None, :keys] & (jnp.arange(keys)[None, None, :] <= slots_t[None, :, None])
        logits = jnp.where(allowed_Bts[:, None, None], logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(v_BSKD.dtype)
        return jnp.einsum("bkgts,bskd->btkgd", probs, v_BsKD).reshape(b, -1, h, d)

    if t <= q_block:
        return block(q_BTHD, slots_T)
    if self_keys:
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
        """Returns (out_BTD, (k_BSKD, v_BSKD) | None).

        kv_cache: None (keys are this call's tokens) or (k_BSKD, v_BSKD, length) where the new
        keys/values are written at slots [length, length + T) before attending over all S slots.
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
        k = apply_rope(k, cos_BTR, sin_BTR)
        new_cache = None
        if kv_cache is not None:
            k_cache, v_cache, length = kv_cache
            k = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, length, 0, 0))
            v = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, length, 0, 0))
            new_cache = (k, v)
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), valid_BS, slots_T, self_keys=kv_cache is None)
        if cfg.attn_output_gate:
            out = out * jax.nn.sigmoid(gate_BTHD.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(out.reshape(b, t, h * d)), new_cache
