"""Building blocks shared by both token mixers: RMSNorm, SwiGLU MLP, (partial) rotary embedding."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax.config import ModelConfig


class Dense(nnx.Linear):
    """nnx.Linear applied to the input flattened to 2-D [N, d_in].

    Same parameters and result; the point is the backward pass on XLA:CPU: with a [B, T, D]
    input the weight gradient contracts over two axes and XLA materialises a 3-D transpose fused
    with the elementwise producers, which its CPU emitter runs ~10x slower than the matmul.
    """

    def __call__(self, x):
        lead = x.shape[:-1]
        return super().__call__(x.reshape(-1, x.shape[-1])).reshape(*lead, -1)


def dense(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs, zero: bool = False) -> nnx.Linear:
    """Bias-free projection with kernel [d_in, d_out] (the transpose of a torch Linear weight)."""
    init = nnx.initializers.zeros_init() if zero else nnx.initializers.normal(0.02)
    return Dense(d_in, d_out, use_bias=False, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                 kernel_init=init, rngs=rngs)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, computed in fp32.

    `plus_one=True` (qwen3_5) scales by (1 + w) with w zero-initialised; otherwise (qwen3) by w
    with w one-initialised. The result is cast back to the input dtype.
    """

    def __init__(self, dim: int, eps: float, plus_one: bool, param_dtype: str):
        init = jnp.zeros if plus_one else jnp.ones
        self.scale = nnx.Param(init((dim,), param_dtype))
        self.eps = eps
        self.plus_one = plus_one

    @jax.named_scope("norm")
    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.scale[...].astype(jnp.float32)
        if self.plus_one:
            return (y * (1.0 + w)).astype(x.dtype)
        # Plain Qwen3 casts the normalised input back before scaling.
        return (w * y.astype(x.dtype)).astype(x.dtype)


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.gate_proj = dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)
        self.up_proj = dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)
        self.down_proj = dense(cfg, cfg.intermediate_size, cfg.hidden_size, rngs)

    @jax.named_scope("mlp")
    def __call__(self, x_BTD):
        return self.down_proj(jax.nn.silu(self.gate_proj(x_BTD)) * self.up_proj(x_BTD))


def rotary_dim(cfg: ModelConfig) -> int:
    return int(cfg.head_dim * cfg.partial_rotary_factor)


def rope_cos_sin(pos_BT, cfg: ModelConfig):
    """cos, sin tables [B, T, rotary_dim] for integer positions (fp32); halves repeat (HF layout)."""
    dim = rotary_dim(cfg)
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    freqs_BTF = pos_BT.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs_BTF, freqs_BTF], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_BTHD, cos_BTR, sin_BTR):
    """Rotates the first R dims of each head (rotate-half convention); the rest pass through."""
    r = cos_BTR.shape[-1]
    rot, rest = x_BTHD[..., :r], x_BTHD[..., r:]
    half = r // 2
    rotated = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    cos, sin = cos_BTR[:, :, None, :], sin_BTR[:, :, None, :]
    out = (rot.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x_BTHD.dtype)
    return jnp.concatenate([out, rest], axis=-1)
