"""Decode state for one batch of sequences: KV cache per full-attention layer, conv prefix and
fp32 recurrent state per Gated DeltaNet layer, and per-row positions."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from trsi_jax.config import ModelConfig


class Cache(NamedTuple):
    k: jax.Array      # [L_full, B, Hkv, S, D] keys after QK-norm and RoPE (head-major: see attend)
    v: jax.Array      # [L_full, B, Hkv, S, D]
    conv: jax.Array   # [L_lin, B, K-1, conv_dim] last K-1 inputs of each GDN causal conv
    state: jax.Array  # [L_lin, B, Hv, Dk, Dv] fp32 recurrent state
    valid: jax.Array  # [B, S] bool: slot holds a real (non-pad) token
    pos: jax.Array    # [B] int32: RoPE position of each row's next real token
    length: jax.Array  # [] int32: slots written so far (same for every row)


def num_layers_by_kind(cfg: ModelConfig) -> tuple[int, int]:
    """(number of GDN layers, number of full-attention layers)."""
    n_full = cfg.num_layers // cfg.full_attention_interval
    return cfg.num_layers - n_full, n_full


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> Cache:
    """Empty cache for `batch` rows of up to `max_len` tokens (prompt + generated).

    Writing past `max_len` is not checked inside jit (slots clamp); size it for the longest episode.
    """
    dtype = jnp.dtype(dtype or cfg.dtype)
    n_lin, n_full = num_layers_by_kind(cfg)
    kv_shape = (n_full, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    conv_c = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + cfg.linear_num_value_heads * cfg.linear_value_head_dim
    return Cache(
        k=jnp.zeros(kv_shape, dtype), v=jnp.zeros(kv_shape, dtype),
        conv=jnp.zeros((n_lin, batch, cfg.linear_conv_kernel - 1, conv_c), dtype),
        state=jnp.zeros((n_lin, batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                         cfg.linear_value_head_dim), jnp.float32),
        valid=jnp.zeros((batch, max_len), bool),
        pos=jnp.zeros((batch,), jnp.int32),
        length=jnp.zeros((), jnp.int32))
