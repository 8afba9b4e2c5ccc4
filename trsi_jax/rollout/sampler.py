"""Batched autoregressive sampling over the model's KV/recurrent cache, all on device.

Prompts are left-padded into one [B, T] block (B and T rounded up to buckets so few shapes
compile), prefilled once, then a jitted `lax.while_loop` decodes until every row has hit a
stop token or its own token limit. Rows finish independently; finished rows keep decoding
padding (batch shapes are static) but their outputs are cut on the host.

Logprobs: for each sampled token we return its log-prob under the distribution it was drawn
from, `rl.losses.sampling_logits` (logits / temperature, ids past the vocab limit excluded; top-p
/ top-k truncation not included, see there). PPO's learner scores tokens with the same function,
so its old policy is the policy that sampled.

Params may carry shardings (e.g. FSDP over a mesh): the jitted functions take the NNX state as
an argument, so XLA partitions the computation from the input shardings.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trsi_jax.rl.losses import sampling_logits


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept (1 = off)
    top_k: int = 0  # keep the k most likely (0 = off)
    max_new_tokens: int = 256
    stop_ids: tuple[int, ...] = ()
    vocab_limit: int = 0  # sample only ids < this (the tokenizer's vocab when the model's is padded); 0 = all

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"SampleConfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SampleConfig.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"SampleConfig needs top_k >= 0 and max_new_tokens >= 1, got {self}")


def sample_tokens(logits_BV: jax.Array, rng: jax.Array, temperature: float, top_p: float, top_k: int,
                  vocab_limit: int = 0) -> jax.Array:
    """One token per row: greedy at temperature 0, else from softmax(logits / T) cut to top-k / top-p."""
    x_BV = sampling_logits(logits_BV.astype(jnp.float32), temperature, vocab_limit)
    if temperature == 0:
        return jnp.argmax(x_BV, axis=-1).astype(jnp.int32)
    if top_k == 0 and top_p >= 1:
        return jax.random.categorical(rng, x_BV, axis=-1).astype(jnp.int32)
    k = top_k if top_k > 0 else x_BV.shape[-1]
    vals_BK, idx_BK = jax.lax.top_k(x_BV, min(k, x_BV.shape[-1]))  # sorted, most likely first
    if top_p < 1:
        probs_BK = jax.nn.softmax(vals_BK, axis=-1)
        mass_before_BK = jnp.cumsum(probs_BK, axis=-1) - probs_BK
        vals_BK = jnp.where(mass_before_BK < top_p, vals_BK, -jnp.inf)  # the top token always stays
    choice_B = jax.random.categorical(rng, vals_BK, axis=-1)
    return jnp.take_along_axis(idx_BK, choice_B[:, None], axis=-1)[:, 0].astype(jnp.int32)


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array, temperature: float = 1.0,
                   vocab_limit: int = 0) -> jax.Array:
    """log pi(token) under the sampling distribution (`sampling_logits`), in fp32."""
    logp_BV = jax.nn.log_softmax(sampling_logits(logits_BV.astype(jnp.float32), temperature, vocab_limit), axis=-1)
    return jnp.take_along_axis(logp_BV, tokens_B[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill(graphdef, state, tokens_BT, mask_BT, cache):
    """Runs the prompt through the cache; logits of the last position only."""
    logits_BV, cache = nnx.merge(graphdef, state).prefill(tokens_BT, mask_BT, cache, last_only=True)
    return logits_BV.astype(jnp.float32), cache


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg", "pad_id"))
def _decode(graphdef, state, logits_BV, cache, rng, limit_B, cfg: SampleConfig, pad_id: int):
    """Samples up to cfg.max_new_tokens per row; row b stops at a stop id or after limit_B[b] tokens."""
    model = nnx.merge(graphdef, state)
    B, N = logits_BV.shape[0], cfg.max_new_tokens
    stop_S = jnp.asarray(cfg.stop_ids or (-1,), jnp.int32)
    n_steps = jnp.minimum(N, jnp.max(limit_B))

    def cond(carry):
        step, done_B = carry[0], carry[-1]
        return (step < n_steps) & ~jnp.all(done_B)

    def body(carry):
        step, logits_BV, cache, rng, toks_BN, logp_BN, len_B, done_B = carry
        rng, key = jax.random.split(rng)
        tok_B = sample_tokens(logits_BV, key, cfg.temperature, cfg.top_p, cfg.top_k, cfg.vocab_limit)
        lp_B = token_logprobs(logits_BV, tok_B, cfg.temperature, cfg.vocab_limit)
        tok_B = jnp.where(done_B, pad_id, tok_B)
        toks_BN = toks_BN.at[:, step].set(tok_B)
        logp_BN = logp_BN.at[:, step].set(jnp.where(done_B, 0.0, lp_B))
        len_B = len_B + (~done_B).astype(jnp.int32)
        fed_B = ~done_B  # a row's stop token enters its cache; what it decodes after never does
        done_B = done_B | jnp.isin(tok_B, stop_S) | (len_B >= limit_B)
        logits_BV, cache = model.decode_step(tok_B, cache, fed_B)
        return step + 1, logits_BV.astype(jnp.float32), cache, rng, toks_BN, logp_BN, len_B, done_B

    carry = (jnp.int32(0), logits_BV, cache, rng, jnp.full((B, N), pad_id, jnp.int32),
             jnp.zeros((B, N), jnp.float32), jnp.zeros((B,), jnp.int32), limit_B <= 0)
    _, _, cache, _, toks_BN, logp_BN, len_B, _ = jax.lax.while_loop(cond, body, carry)
    return toks_BN, logp_BN, len_B, cache


def _bucket(n: int, minimum: int, step: int = 256) -> int:
    """Next power of two >= n (at least `minimum`) up to `step`, then the next multiple of `step`:
    few compiled shapes, and at most `step` wasted positions for long prompts."""
    if n > step:
        return -(-n // step) * step
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


@dataclasses.dataclass(frozen=True, eq=False)
class Prefix:
    """One sequence's cache after a `generate_cached` call, compacted to its real tokens (host
    arrays): a later prompt that starts with `tokens` prefills only what follows them."""

    tokens: tuple[int, ...]  # prompt + sampled ids, in cache order
    k: np.ndarray  # [L_full, Hkv, n, D] (n = len(tokens))
    v: np.ndarray
    conv: np.ndarray  # [L_lin, K-1, conv_dim]
    state: np.ndarray  # [L_lin, Hv, Dk, Dv] fp32

    def starts(self, prompt: Sequence[int]) -> bool:
        """`prompt` continues this sequence with at least one new token."""
        return len(self.tokens) < len(prompt) and tuple(prompt[:len(self.tokens)]) == self.tokens


class Sampler:
    """`generate(prompts, cfg, rng)` -> [(tokens, logprobs)] per prompt, stop token included.

    Each row may generate up to max_len minus its OWN prompt's length: the cache is T + the
    longest row's room wide (T = the bucketed longest prompt), so a long prompt in the batch
    never cuts a short one's reply (positions count each row's own tokens, so no row passes
    max_len), and short batches attend over a short cache; the widest cache is the bucketed
    max_len plus max_new_tokens.
    `generate_cached` also takes and returns each row's `Prefix`: a row continuing a cached
    sequence (a conversation's earlier turns) prefills only its new tokens. Cached rows sit
    right-aligned before the new block (their slots valid, the rest not), so the result equals a
    full re-prefill up to float rounding (tests/test_sampler.py).
    With a `mesh`, prompts and the cache are split over the batch axes (data, fsdp) and the
    batch is padded to a multiple of their size; params keep whatever shardings they carry.
    """

    def __init__(self, model, max_len: int, pad_id: int = 0, cache_dtype=None, mesh=None):
        self.model = model
        self.max_len = max_len
        self.pad_id = pad_id
        self.cache_dtype = cache_dtype or jnp.dtype(model.cfg.dtype)
        self.mesh = mesh

    def generate(self, prompts: Sequence[Sequence[int]], cfg: SampleConfig, rng: jax.Array,
                 max_new_tokens: Sequence[int] | None = None) -> list[tuple[list[int], list[float]]]:
        """Samples a continuation of every prompt; `max_new_tokens` optionally caps rows individually."""
        return self.generate_cached(prompts, cfg, rng, max_new_tokens)[0]

    def generate_cached(self, prompts: Sequence[Sequence[int]], cfg: SampleConfig, rng: jax.Array,
                        max_new_tokens: Sequence[int] | None = None,
                        prefixes: Sequence[Prefix | None] | None = None, keep: bool = False):
        """(outputs as `generate`, [Prefix] per row if `keep` else None). `prefixes[b]`, if given,
        must hold a proper prefix of `prompts[b]` (else that row is prefilled whole)."""
        if not prompts:
            return [], [] if keep else None
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        longest = max(len(p) for p in prompts)
        if longest >= self.max_len:
            raise ValueError(f"prompt of {longest} tokens leaves no room to generate within max_len={self.max_len}")
        prefixes = [x if x is not None and x.starts(p) else None
                    for x, p in zip(prefixes or [None] * len(prompts), prompts)]
        cached = [len(x.tokens) if x is not None else 0 for x in prefixes]
        caps = [cfg.max_new_tokens if max_new_tokens is None else min(cfg.max_new_tokens, max_new_tokens[b])
                for b in range(len(prompts))]
        want = [min(c, self.max_len - len(p)) for c, p in zip(caps, prompts)]
        C = _bucket(max(cached), 16) if max(cached) else 0
        T = _bucket(max(len(p) - c for p, c in zip(prompts, cached)), 16)
        width = C + T + _bucket(max(want), 16)  # cached block + new block + the longest row's room
        B = _bucket(len(prompts), 1, step=1 << 30)
        if self.mesh is not None:
            n = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
            B = -(-B // n) * n
        tokens_BT = np.full((B, T), self.pad_id, np.int32)
        mask_BT = np.zeros((B, T), np.int32)
        limit_B = np.zeros((B,), np.int32)  # padding rows: limit 0, done from the start
        for b, (p, c) in enumerate(zip(prompts, cached)):
            tokens_BT[b, T - len(p) + c:] = p[c:]
            mask_BT[b, T - len(p) + c:] = 1
            limit_B[b] = want[b]
        tokens_BT[len(prompts):, -1] = self.pad_id  # dummy rows: one real token keeps attention finite
        mask_BT[len(prompts):, -1] = 1

        from trsi_jax.models import init_cache
        from trsi_jax.sharding import to_host

        graphdef, state = nnx.split(self.model)
        cache = init_cache(self.model.cfg, B, width, self.cache_dtype)
        if C:
            cache = _with_prefixes(cache, prefixes, C)
        inputs = (tokens_BT, mask_BT, limit_B)
        if self.mesh is not None:
            from trsi_jax import sharding

            cache = jax.device_put(cache, sharding.cache_shardings(cache, self.mesh))
            inputs = [jax.device_put(x, sharding.batch_sharding(self.mesh, x.ndim)) for x in inputs]
        tokens_BT, mask_BT, limit_B = (jnp.asarray(x) for x in inputs)
        logits_BV, cache = _prefill(graphdef, state, tokens_BT, mask_BT, cache)
        toks_BN, logp_BN, len_B, cache = _decode(graphdef, state, logits_BV, cache, rng, limit_B, cfg, self.pad_id)
        toks_BN, logp_BN, len_B = to_host((toks_BN, logp_BN, len_B))  # whole batch on every host
        out = [(toks_BN[b, :len_B[b]].tolist(), logp_BN[b, :len_B[b]].tolist()) for b in range(len(prompts))]
        if not keep:
            return out, None
        host = to_host((cache.k, cache.v, cache.conv, cache.state, cache.valid))
        return out, [_prefix_of(host, b, tuple(p) + tuple(o[0])) for b, (p, o) in enumerate(zip(prompts, out))]


def _with_prefixes(cache, prefixes: Sequence[Prefix | None], width: int):
    """`cache` with each row's prefix right-aligned in slots [width - n, width), length = width."""
    k, v, conv, state, valid, pos = (np.zeros(x.shape, x.dtype) for x in  # built on the host, sent once
                                     (cache.k, cache.v, cache.conv, cache.state, cache.valid, cache.pos))
    for b, x in enumerate(prefixes):
        if x is None:
            continue
        n = len(x.tokens)
        k[:, b, :, width - n:width], v[:, b, :, width - n:width] = x.k, x.v
        conv[:, b], state[:, b] = x.conv, x.state
        valid[b, width - n:width], pos[b] = True, n
    return cache._replace(k=jnp.asarray(k), v=jnp.asarray(v), conv=jnp.asarray(conv), state=jnp.asarray(state),
                          valid=jnp.asarray(valid), pos=jnp.asarray(pos), length=jnp.int32(width))


def _prefix_of(host, b: int, tokens: tuple[int, ...]) -> Prefix:
    k, v, conv, state, valid = host
    slots = np.flatnonzero(valid[b])
    if len(slots) != len(tokens):
        raise AssertionError(f"row {b}: {len(slots)} cached slots for {len(tokens)} tokens")
    return Prefix(tokens=tokens, k=k[:, b][:, :, slots], v=v[:, b][:, :, slots], conv=conv[:, b], state=state[:, b])
