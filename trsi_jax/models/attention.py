"""Full (softmax) attention: GQA, QK-norm, partial RoPE, optional sigmoid output gate (qwen3_5)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax.config import ModelConfig
from trsi_jax.models.layers import RMSNorm, apply_rope, dense


def attend(q_BTHD, k_BSKD, v_BSKD, allowed_BTS):
    """Softmax attention with grouped KV heads; logits and softmax in fp32.

    `allowed_BTS` says which key slots each query may read (causality and padding). A query row
    with no allowed key (a left-pad position) gets a finite, meaningless output.
    """
    b, t, h, d = q_BTHD.shape
    kv = k_BSKD.shape[2]
    q_BTKGD = q_BTHD.reshape(b, t, kv, h // kv, d)
    logits_BKGTS = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k_BSKD,
                              preferred_element_type=jnp.float32) * (d ** -0.5)
    logits_BKGTS = jnp.where(allowed_BTS[:, None, None], logits_BKGTS, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits_BKGTS, axis=-1).astype(v_BSKD.dtype)
    out_BTKGD = jnp.einsum("bkgts,bskd->btkgd", probs, v_BSKD)
    return out_BTKGD.reshape(b, t, h, d)


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

    def __call__(self, x_BTD, cos_BTR, sin_BTR, allowed_BTS, kv_cache=None):
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
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), allowed_BTS)
        if cfg.attn_output_gate:
            out = out * jax.nn.sigmoid(gate_BTHD.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(out.reshape(b, t, h * d)), new_cache
