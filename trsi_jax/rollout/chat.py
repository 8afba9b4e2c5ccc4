"""Qwen chat template over token segments, with the masks RL and SFT need.

`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message; each piece is tokenized on its own, so
encoding an episode turn by turn (what the sampler saw) equals encoding it whole, for any tokenizer.
An assistant message may carry `"tokens"`: the ids the sampler produced (ending in `<|im_end|>`
unless the reply was cut off); they are kept exactly, never re-tokenized from the text.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from trsi_jax.rollout.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One episode as a token sequence.

    policy_mask_T: 1 on assistant content tokens and their `<|im_end|>` (when sampled), else 0.
    turn_ids_T: k on the header, content and closing tokens of assistant turn k and on the
      observation after it; -1 before the first assistant turn.
    turn_end_positions: index of the last policy token of each assistant turn.
    """

    tokens_T: np.ndarray
    policy_mask_T: np.ndarray
    turn_ids_T: np.ndarray
    turn_end_positions: tuple[int, ...]


def _check(message: Any, i: int) -> tuple[str, str]:
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r:.200}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(f"messages[{i}]['role'] = {role!r}; expected one of {ROLES}")
    if not isinstance(content, str):
        raise ValueError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}")
    return role, content


def generation_prompt(tok: Tokenizer) -> list[int]:
    """`<|im_start|>assistant\\n`: what the sampler continues from."""
    return [tok.im_start_id] + tok.encode("assistant\n")


def encode_chat(messages: Sequence[dict], tok: Tokenizer) -> Encoded:
    tokens: list[int] = []
    mask: list[int] = []
    turns: list[int] = []
    ends: list[int] = []
    turn = -1

    def emit(ids: Sequence[int], m: int):
        tokens.extend(int(t) for t in ids)
        mask.extend([m] * len(ids))
        turns.extend([turn] * len(ids))

    for i, message in enumerate(messages):
        role, content = _check(message, i)
        if role == "assistant":
            turn += 1
            emit(generation_prompt(tok), 0)
            sampled = message.get("tokens")
            if sampled is None:
                emit(tok.encode(content) + [tok.im_end_id], 1)
            else:
                sampled = [int(t) for t in sampled]
                if not sampled:
                    raise ValueError(f"messages[{i}] has an empty 'tokens' list")
                emit(sampled, 1)
                if sampled[-1] != tok.im_end_id:  # cut off: close the turn, not a policy token
                    ends.append(len(tokens) - 1)
                    emit([tok.im_end_id], 0)
                    emit(tok.encode("\n"), 0)
                    continue
            ends.append(len(tokens) - 1)
            emit(tok.encode("\n"), 0)
        else:
            emit([tok.im_start_id] + tok.encode(f"{role}\n") + tok.encode(content) + [tok.im_end_id]
                 + tok.encode("\n"), 0)
    return Encoded(np.asarray(tokens, np.int32), np.asarray(mask, np.int32),
                   np.asarray(turns, np.int32), tuple(ends))


def encode_prompt(messages: Sequence[dict], tok: Tokenizer) -> list[int]:
    """The conversation so far plus the generation prompt: the sampler's input."""
    return encode_chat(messages, tok).tokens_T.tolist() + generation_prompt(tok)
