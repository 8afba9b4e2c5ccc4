"""Qwen3.5-family causal LM (qwen3_5 hybrid or dense qwen3) and its value-head twin, the Critic.

Layers of one kind are stored stacked (leading layer axis) in `linear_layers` (Gated DeltaNet)
and `full_layers` (attention). A block is `full_attention_interval - 1` GDN layers then one
full layer; with `cfg.scan_layers` the blocks run under `jax.lax.scan`, so the model compiles
one block whatever its depth; otherwise the same stacked weights run in an unrolled loop.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from trsi_jax import sharding
from trsi_jax.config import ModelConfig
from trsi_jax.models.attention import Attention
from trsi_jax.models.cache import Cache, num_layers_by_kind
from trsi_jax.models.layers import MLP, Dense, RMSNorm, dense, rope_cos_sin
from trsi_jax.models.linear_attention import GatedDeltaNet

REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class DecoderLayer(nnx.Module):
    """Pre-norm residual layer: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig, kind: str, rngs: nnx.Rngs):
        self.kind = kind
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_plus_one, cfg.param_dtype)  # noqa: E731
        self.input_layernorm = norm()
        if kind == "full":
            self.self_attn = Attention(cfg, rngs)
        else:
            self.linear_attn = GatedDeltaNet(cfg, rngs)
        self.post_attention_layernorm = norm()
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x_BTD, ctx, layer_cache):
        h = self.input_layernorm(x_BTD)
        if self.kind == "full":
            h, new_cache = self.self_attn(h, ctx["cos"], ctx["sin"], ctx["valid"], ctx["slots"],
                                          None if layer_cache is None else (*layer_cache, ctx["length"]))
        else:
            h, new_cache = self.linear_attn(h, ctx["mask"], layer_cache)
        x_BTD = x_BTD + h
        return x_BTD + self.mlp(self.post_attention_layernorm(x_BTD)), new_cache


def _stack(cfg: ModelConfig, kind: str, n: int, rngs: nnx.Rngs):
    """n DecoderLayers with parameters stacked on a leading axis."""
    if n == 0:
        return None

    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=0, out_axes=0)
    def create(r):
        return DecoderLayer(cfg, kind, r)

    return create(rngs)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _init_state(ctor, cfg: ModelConfig, key):
    return nnx.state(ctor(cfg, nnx.Rngs(key)))


def _build(ctor, cfg: ModelConfig, rngs: nnx.Rngs):
    """ctor(cfg, rngs) initialised in one compiled call (cached per config) instead of op by op."""
    key = rngs.params()
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: ctor(cfg, nnx.Rngs(key))))
    return nnx.merge(graphdef, _init_state(ctor, cfg, key))


class Backbone(nnx.Module):
    """Embeddings, decoder layers and final norm; HF `model.*`."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype,
                                      param_dtype=cfg.param_dtype, rngs=rngs,
                                      embedding_init=nnx.initializers.normal(0.02))
        n_lin, n_full = num_layers_by_kind(cfg)
        self.linear_layers = _stack(cfg, "linear", n_lin, rngs)
        self.full_layers = _stack(cfg, "full", n_full, rngs)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_plus_one, cfg.param_dtype)

    def __call__(self, tokens_BT, mask_BT=None, cache: Cache | None = None):
        """Final-normed hidden states [B, T, D] and the updated cache (None without one)."""
        cfg = self.cfg
        b, t = tokens_BT.shape
        if mask_BT is None:
            mask_BT = jnp.ones((b, t), bool)
        mask_BT = mask_BT.astype(bool)
        steps_BT = jnp.cumsum(mask_BT, axis=1, dtype=jnp.int32) - 1
        if cache is None:
            pos_BT = jnp.maximum(steps_BT, 0)
            slots_T = jnp.arange(t)
            valid_BS, length = mask_BT, 0
        else:
            pos_BT = cache.pos[:, None] + jnp.maximum(steps_BT, 0)
            slots_T = cache.length + jnp.arange(t)
            valid_BS = jax.lax.dynamic_update_slice(cache.valid, mask_BT, (0, cache.length))
            length = cache.length
        cos, sin = rope_cos_sin(pos_BT, cfg)
        ctx = dict(mask=mask_BT, cos=cos, sin=sin, valid=valid_BS, slots=slots_T, length=length)

        table = sharding.gather_weight("embed_tokens/embedding", self.embed_tokens.embedding[...])
        x_BTD = sharding.constrain_batch(jnp.take(table, tokens_BT, axis=0).astype(cfg.dtype))
        x_BTD, layer_caches = self._run_layers(x_BTD, ctx, cache)
        h_BTD = self.norm(x_BTD)
        if cache is None:
            return h_BTD, None
        k, v, conv, state = layer_caches
        return h_BTD, Cache(k=k, v=v, conv=conv, state=state, valid=valid_BS,
                            pos=cache.pos + mask_BT.sum(axis=1, dtype=jnp.int32), length=cache.length + t)

    def _run_layers(self, x_BTD, ctx, cache):
        cfg = self.cfg
        per_block = cfg.full_attention_interval - 1
        n_blocks = cfg.num_layers // cfg.full_attention_interval
        full_def, full_state = nnx.split(self.full_layers)
        lin_def, lin_state = nnx.split(self.linear_layers) if per_block else (None, None)

        def layer(graphdef, state, x, layer_cache):
            state = sharding.gather_weights(state)  # FSDP: this layer's weights only
            x, new_cache = nnx.merge(graphdef, state)(sharding.constrain_batch(x), ctx, layer_cache)
            return sharding.constrain_batch(x), new_cache

        if cfg.remat != "none":
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[cfg.remat], static_argnums=(0,))

        def by_block(tree):  # [L_lin, ...] -> [N, per_block, ...]
            return jax.tree.map(lambda a: a.reshape(n_blocks, per_block, *a.shape[1:]), tree)

        # The KV cache rides in the carry, whole (each attention layer writes its new slots in
        # place); the small GDN caches go through xs/ys, one block's slice at a time.
        xs = dict(full=full_state, lin=by_block(lin_state) if per_block else None, i=jnp.arange(n_blocks),
                  gdn=None if cache is None or not per_block else by_block((cache.conv, cache.state)))

        def block(carry, xs_i):
            x, kv = carry
            lin_out = []
            for j in range(per_block):
                lin_cache = None if xs_i["gdn"] is None else jax.tree.map(lambda a: a[j], xs_i["gdn"])
                x, c = layer(lin_def, jax.tree.map(lambda a: a[j], xs_i["lin"]), x, lin_cache)
                lin_out.append(c)
            x, kv = layer(full_def, xs_i["full"], x, None if kv is None else (*kv, xs_i["i"]))
            gdn = None if xs_i["gdn"] is None else jax.tree.map(lambda *a: jnp.stack(a), *lin_out)
            return (x, kv), gdn

        carry = (x_BTD, None if cache is None else (cache.k, cache.v))
        if cfg.scan_layers:
            (x_BTD, kv), gdn = jax.lax.scan(block, carry, xs)
        else:
            outs = []
            for i in range(n_blocks):
                carry, y = block(carry, jax.tree.map(lambda a: a[i], xs))
                outs.append(y)
            (x_BTD, kv), gdn = carry, jax.tree.map(lambda *a: jnp.stack(a), *outs)
        if cache is None:
            return x_BTD, None
        k, v = kv
        if per_block:
            conv, state = jax.tree.map(lambda a: a.reshape(n_blocks * per_block, *a.shape[2:]), gdn)
        else:
            conv, state = cache.conv, cache.state
        return x_BTD, (k, v, conv, state)


class Qwen(nnx.Module):
    """Causal LM: `logits_BTV = Qwen(cfg, rngs=nnx.Rngs(0))(tokens_BT, mask_BT)`.

    mask_BT: 1 = real token, 0 = pad; pads may sit left (generation prompts) or right (training).
    Positions count real tokens only, so a left-padded row equals the same row unpadded.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.mtp_layers:
            raise NotImplementedError(
                f"ModelConfig.mtp_layers={cfg.mtp_layers}: multi-token-prediction layers are not "
                "implemented; set mtp_layers=0 (`mtp.*` checkpoint weights are skipped on load)")
        self.cfg = cfg
        self.model = _build(Backbone, cfg, rngs)
        self.lm_head = None if cfg.tie_embeddings else dense(cfg, cfg.hidden_size, cfg.vocab_size, rngs)

    @jax.named_scope("lm_head")
    def _logits(self, h_BTD):
        if self.lm_head is None:
            return self.model.embed_tokens.attend(h_BTD)
        kernel = sharding.gather_weight("lm_head/kernel", self.lm_head.kernel[...])
        dtype = self.cfg.dtype
        h_ND = h_BTD.reshape(-1, h_BTD.shape[-1]).astype(dtype)  # 2-D: see layers.Dense
        return jnp.dot(h_ND, kernel.astype(dtype)).reshape(*h_BTD.shape[:-1], -1)

    def __call__(self, tokens_BT, mask_BT=None):
        return self._logits(self.hidden(tokens_BT, mask_BT))

    def hidden(self, tokens_BT, mask_BT=None):
        return self.model(tokens_BT, mask_BT)[0]

    def prefill(self, tokens_BT, mask_BT, cache: Cache, *, last_only: bool = False):
        """Runs a chunk of tokens through the cache (the prompt, or a continuation).

        Pads must be at the left of the first chunk; later chunks should carry no pads (a pad
        inside a continuation still enters the conv window as a zero input). `last_only` returns
        logits_BV of the last position alone: samplers need no B*T*V projection (tens of GB for
        long 27B prompts).
        """
        h_BTD, cache = self.model(tokens_BT, mask_BT, cache)
        if last_only:
            return self._logits(h_BTD[:, -1:])[:, 0], cache
        return self._logits(h_BTD), cache

    def decode_step(self, tokens_B, cache: Cache, mask_B=None):
        """One new token per row: returns (logits_BV, cache). Rows with mask 0 (finished) leave
        their cache as it was."""
        h_B1D, cache = self.model(tokens_B[:, None], None if mask_B is None else mask_B[:, None], cache)
        return self._logits(h_B1D)[:, 0], cache


class Critic(nnx.Module):
    """Value model: the policy's backbone plus a zero-initialised scalar head per token (fp32)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, backbone: Backbone | None = None):
        self.cfg = cfg
        self.model = backbone if backbone is not None else _build(Backbone, cfg, rngs)
        self.value_head = Dense(cfg.hidden_size, 1, use_bias=True, dtype=jnp.float32,
                                param_dtype=jnp.float32, kernel_init=nnx.initializers.zeros_init(),
                                rngs=rngs)

    def __call__(self, tokens_BT, mask_BT=None):
        h_BTD = self.model(tokens_BT, mask_BT)[0]
        return self.value_head(h_BTD.astype(jnp.float32))[..., 0]

    @classmethod
    def from_policy(cls, policy: Qwen, seed: int = 0) -> "Critic":
        """A critic whose backbone is a copy of the policy's (separate Variables, same arrays)."""
        return cls(policy.cfg, rngs=nnx.Rngs(seed), backbone=nnx.clone(policy.model))
