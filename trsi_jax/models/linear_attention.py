"""Gated DeltaNet token mixer (qwen3_5 "linear_attention" layers)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax.config import ModelConfig
from trsi_jax.models.gated_deltanet import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule
from trsi_jax.models.layers import dense


def conv_dim(cfg: ModelConfig) -> int:
    return 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim


class GatedRMSNorm(nnx.Module):
    """RMSNorm(o) * w * silu(z) per value head; plain w (one-initialised), fp32 math."""

    def __init__(self, dim: int, eps: float, param_dtype: str):
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    @jax.named_scope("norm")
    def __call__(self, o, z):
        o32 = o.astype(jnp.float32)
        y = o32 * jax.lax.rsqrt(jnp.mean(o32 * o32, axis=-1, keepdims=True) + self.eps)
        y = self.scale[...] * y.astype(o.dtype)
        return (y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(o.dtype)


class GatedDeltaNet(nnx.Module):
    """in_proj_qkv -> causal conv + SiLU -> gated delta rule -> gated RMSNorm(o, z) -> out_proj."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        self.in_proj_qkv = dense(cfg, cfg.hidden_size, conv_dim(cfg), rngs)
        self.in_proj_z = dense(cfg, cfg.hidden_size, hv * dv, rngs)
        self.in_proj_b = dense(cfg, cfg.hidden_size, hv, rngs)
        self.in_proj_a = dense(cfg, cfg.hidden_size, hv, rngs)
        bound = 1.0 / cfg.linear_conv_kernel ** 0.5
        self.conv1d = nnx.Param(jax.random.uniform(
            rngs.params(), (cfg.linear_conv_kernel, conv_dim(cfg)), cfg.param_dtype, -bound, bound))
        self.A_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (hv,), jnp.float32, 1.0, 16.0)))
        self.dt_bias = nnx.Param(jnp.ones((hv,), jnp.float32))
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps, cfg.param_dtype)
        self.out_proj = dense(cfg, hv * dv, cfg.hidden_size, rngs)

    @jax.named_scope("gdn_proj")
    def __call__(self, x_BTD, mask_BT, state=None):
        """Returns (out_BTD, (conv_BKC, rec_BHDV) | None).

        Pad positions (mask 0) get zero input, zero decay and zero write strength, so they leave
        the recurrent state untouched (left-padded prompts are exact). `state` = (conv prefix,
        recurrent fp32 state) continues a sequence, whose pads must then sit left (the conv's
        prefix moves past them); one-token calls use the recurrent form.
        """
        cfg = self.cfg
        b, t, _ = x_BTD.shape
        hk, dk = cfg.linear_num_key_heads, cfg.linear_key_head_dim
        hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
        m_BT1 = mask_BT[..., None].astype(x_BTD.dtype)
        x_BTD = x_BTD * m_BT1
        conv_prefix, rec = (None, None) if state is None else state
        pads_B = None if state is None else t - mask_BT.sum(axis=1, dtype=jnp.int32)
        qkv, new_prefix = causal_conv1d(self.in_proj_qkv(x_BTD), self.conv1d[...], conv_prefix, pads_B)
        q = qkv[..., :hk * dk].reshape(b, t, hk, dk)
        k = qkv[..., hk * dk:2 * hk * dk].reshape(b, t, hk, dk)
        v = qkv[..., 2 * hk * dk:].reshape(b, t, hv, dv)
        keep = mask_BT.astype(jnp.float32)[..., None]
        beta = jax.nn.sigmoid(self.in_proj_b(x_BTD).astype(jnp.float32)) * keep
        a = self.in_proj_a(x_BTD).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32))
        g = g * keep
        if t == 1 and rec is not None:
            o, new_rec = recurrent_gated_delta_rule(q, k, v, g, beta, rec)
        else:
            o, new_rec = chunk_gated_delta_rule(q, k, v, g, beta, rec, chunk=cfg.gdn_chunk_size, impl=cfg.gdn_impl)
        z = self.in_proj_z(x_BTD).reshape(b, t, hv, dv)
        o = self.norm(o.astype(x_BTD.dtype), z).reshape(b, t, hv * dv)
        out = self.out_proj(o)
        return out, (None if state is None else (new_prefix, new_rec))
