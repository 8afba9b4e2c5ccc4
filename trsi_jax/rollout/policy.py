"""Policies map conversations to replies; the episode runner batches all active episodes per call."""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import jax

from trsi_jax.rollout.chat import encode_prompt
from trsi_jax.rollout.sampler import Prefix, SampleConfig, Sampler
from trsi_jax.rollout.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Reply:
    """What the policy said: text (without `<|im_end|>`), the sampled ids (with it, if produced), their logprobs."""

    text: str
    tokens: list[int]
    logprobs: list[float] | None = None  # None when no model produced the tokens (scripted)


class Policy(Protocol):
    tokenizer: Tokenizer

    def act(self, conversations: Sequence[list[dict]],
            max_new_tokens: Sequence[int] | None = None) -> list[Reply]: ...


class ModelPolicy:
    """A JAX model sampled with `Sampler`; prompts use the exact tokens of earlier sampled turns.

    Stops at `<|im_end|>` / `<|endoftext|>` unless `sample_cfg.stop_ids` says otherwise, and never
    samples ids past the tokenizer's vocab (the model's vocab may be padded).
    With `reuse_cache`, each call keeps every row's cache (`Prefix`) until the next call, where a
    prompt that extends one (the same conversation one turn on) prefills only its new tokens;
    `prefilled` counts the prompt tokens actually run through the model."""

    def __init__(self, model, tokenizer: Tokenizer, sample_cfg: SampleConfig, max_len: int, seed: int = 0,
                 mesh=None, reuse_cache: bool = True):
        stop = tuple(sample_cfg.stop_ids) or (tokenizer.im_end_id, tokenizer.eos_id)
        self.sample_cfg = dataclasses.replace(sample_cfg, stop_ids=stop,
                                              vocab_limit=sample_cfg.vocab_limit or tokenizer.vocab_size)
        self.tokenizer = tokenizer
        self.sampler = Sampler(model, max_len, pad_id=tokenizer.pad_id, mesh=mesh)
        self._rng = jax.random.key(seed)
        self.reuse_cache = reuse_cache
        self._kept: list[Prefix] = []  # the last call's caches
        self.prefilled = 0

    def _match(self, prompt: list[int]) -> Prefix | None:
        """The longest kept cache whose tokens start `prompt` (each is used once)."""
        fits = [i for i, x in enumerate(self._kept) if x.starts(prompt)]
        return self._kept.pop(max(fits, key=lambda i: len(self._kept[i].tokens))) if fits else None

    def act(self, conversations, max_new_tokens=None) -> list[Reply]:
        prompts = [encode_prompt(c, self.tokenizer) for c in conversations]
        self._rng, key = jax.random.split(self._rng)
        prefixes = [self._match(p) if self.reuse_cache else None for p in prompts]
        self.prefilled += sum(len(p) - (len(x.tokens) if x else 0) for p, x in zip(prompts, prefixes))
        out, kept = self.sampler.generate_cached(prompts, self.sample_cfg, key, max_new_tokens, prefixes,
                                                 keep=self.reuse_cache)
        self._kept = kept or []
        replies = []
        for tokens, logprobs in out:
            body = tokens[:-1] if tokens and tokens[-1] in self.sample_cfg.stop_ids else tokens
            replies.append(Reply(self.tokenizer.decode(body), tokens, logprobs))
        return replies


class ScriptedPolicy:
    """Replies from a plain function `fn(conversation) -> text` (tests, oracles, demos)."""

    def __init__(self, fn: Callable[[list[dict]], str], tokenizer: Tokenizer):
        self.fn = fn
        self.tokenizer = tokenizer

    def act(self, conversations, max_new_tokens=None) -> list[Reply]:
        replies = []
        for i, conv in enumerate(conversations):
            text = self.fn(conv)
            tokens = self.tokenizer.encode(text)
            if max_new_tokens is not None and len(tokens) + 1 > max_new_tokens[i]:
                tokens = tokens[:max(max_new_tokens[i], 1)]  # cut off like a sampler at its limit
                text = self.tokenizer.decode(tokens)
            else:
                tokens = tokens + [self.tokenizer.im_end_id]
            replies.append(Reply(text, tokens))
        return replies
