"""Chat encoding: the model's own chat template, tokenized as `apply_chat_template` tokenizes it,
with sampled replies kept token for token, and the masks RL and SFT need.

A conversation is rendered to text by the tokenizer's jinja `chat_template` (its `thinking` flag
is the template's `enable_thinking`), or by the built-in Qwen-style ChatML template below when the
tokenizer has none (the byte tokenizer; it has no reasoning blocks, so `thinking` changes nothing
there). The text is tokenized whole, so role headers and content share canonical ids (content
starting with "\\n" included). An assistant message may carry
`"tokens"`: the ids the sampler produced (ending in `<|im_end|>` unless cut off). Where the template
renders that reply, the ids are spliced in verbatim (token in, token out), never re-tokenized.

Qwen3's template is not prefix-stable: it drops the reasoning of assistant turns before the last
user message, and the empty `<think>\\n\\n</think>\\n\\n` of non-thinking mode is in the generation
prompt but not in earlier turns. A later prompt shows an earlier reply as the template renders it:
the sampled ids after `</think>` and its newlines when the reasoning is dropped. An episode's
training sequence is its whole rendering (how the last prompt saw every turn); its policy tokens
are exactly the sampled ids that rendering keeps.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np
from absl import logging

from trsi_jax.rollout.tokenizer import IM_END, IM_START, Tokenizer

ROLES = ("system", "user", "assistant", "tool")
THINK_END = "</think>"

# Qwen-style ChatML for tokenizers without a template: Qwen3's layout (tool results as a user turn
# of <tool_response> blocks) without reasoning blocks.
BUILTIN_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One episode as a token sequence.

    policy_mask_T: 1 exactly on the sampled ids the rendering keeps (replies with "tokens"), or on
      a text reply as rendered after the generation prompt's header, through its `<|im_end|>`.
    turn_ids_T: k on the header, content and closing tokens of assistant turn k and on the
      observation after it; -1 before the first assistant turn.
    turn_end_positions: index of the last policy token of each assistant turn (its `<|im_end|>`
      when the rendering keeps none of a sampled reply).
    reply_starts: per assistant turn, the index into its sampled "tokens" of the first id kept
      (0 = all; >0 when the template dropped its reasoning; len(tokens) when none was kept).
    """

    tokens_T: np.ndarray
    policy_mask_T: np.ndarray
    turn_ids_T: np.ndarray
    turn_end_positions: tuple[int, ...]
    reply_starts: tuple[int, ...]


def _check(message: Any, i: int) -> tuple[str, str]:
    if not isinstance(message, dict) or "role" not in message or "content" not in message:
        raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r:.200}")
    role, content = message["role"], message["content"]
    if role not in ROLES:
        raise ValueError(f"messages[{i}]['role'] = {role!r}; expected one of {ROLES}")
    if not isinstance(content, str):
        raise ValueError(f"messages[{i}]['content'] must be a string, got {type(content).__name__}")
    return role, content


def _render(messages: Sequence[dict], template: str, thinking: bool, template_vars: tuple,
            add_generation_prompt: bool) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    chat = [{k: v for k, v in m.items() if k != "tokens"} for m in messages]
    (text,), _ = render_jinja_template([chat], chat_template=template, add_generation_prompt=add_generation_prompt,
                                       enable_thinking=thinking, **dict(template_vars))
    return text


def _template(tok: Tokenizer) -> tuple[str, bool, tuple]:
    return (tok.chat_template or BUILTIN_TEMPLATE, bool(tok.thinking), tuple(sorted(tok.template_vars.items())))


@functools.lru_cache(maxsize=32)
def _generation_header(template: str, thinking: bool, template_vars: tuple) -> str:
    """What the template appends for `add_generation_prompt`: the text the sampler continues."""
    probe = [{"role": "user", "content": "x"}]
    with_, without = (_render(probe, template, thinking, template_vars, g) for g in (True, False))
    header = with_[len(without):]
    if not with_.startswith(without) or not header.startswith(IM_START + "assistant"):
        raise ValueError(f"the chat template's generation prompt is {header!r}; trsi_jax needs a ChatML-style "
                         "(Qwen) template whose generation prompt starts with '<|im_start|>assistant'")
    return header


def generation_prompt(tok: Tokenizer) -> list[int]:
    """`<|im_start|>assistant\\n` (+ Qwen3's empty think block when not thinking): what the sampler continues."""
    return tok.encode_rendered(_generation_header(*_template(tok)))[0]


@dataclasses.dataclass
class _Turn:
    """One assistant message in the rendered text (character indices)."""

    start: int  # its `<|im_start|>`
    body: int  # first character of the reply (after the generation prompt's header)
    close: int  # its closing `<|im_end|>`
    splice: tuple[int, int, list[int]] | None = None  # (begin, end, sampled ids kept) for sampled replies
    reply_start: int = 0
    lost: bool = False  # sampled, but the rendering keeps none of its ids


def _candidates(ids: list[int], tok: Tokenizer) -> list[int]:
    """Where the kept part of a sampled reply may begin: all of it, or after its last `</think>`
    id and the newline ids that follow (what Qwen3 keeps of a reply whose reasoning it drops)."""
    think = tok.encode_rendered(THINK_END)[0]
    out = [0]
    if len(think) == 1 and think[0] in ids:
        j = len(ids) - ids[::-1].index(think[0])
        out.append(j)
        while j < len(ids) and set(tok.decode(ids[j:j + 1])) == {"\n"}:
            j += 1
            out.append(j)
    return out


def _splice(turn: _Turn, sampled: list[int], text: str, tok: Tokenizer, i: int) -> _Turn:
    """Locates the longest kept tail of a sampled reply in its rendered turn."""
    ended = sampled[-1] == tok.im_end_id
    ids = sampled[:-1] if ended else sampled
    for j in _candidates(ids, tok):
        kept = tok.decode(ids[j:])
        at = text.find(kept + IM_END, turn.start)
        if at >= 0 and IM_START not in text[turn.start + len(IM_START):at]:
            end = at + len(kept) + (len(IM_END) if ended else 0)
            return dataclasses.replace(turn, close=at + len(kept), splice=(at, end, sampled[j:]), reply_start=j)
    logging.warning("messages[%d]: the chat template renders no tail of the sampled reply verbatim; its %d ids "
                    "are re-tokenized from the rendered text and carry no policy mask", i, len(sampled))
    return dataclasses.replace(turn, reply_start=len(sampled), lost=True)


def _layout(messages: Sequence[dict], text: str, tok: Tokenizer, header: str) -> list[_Turn]:
    turns, cursor = [], 0
    for i, message in enumerate(messages):
        role, content = message["role"], message["content"]
        if role != "assistant":
            at = text.find(content, cursor)
            if at < 0:
                raise ValueError(f"the chat template does not render messages[{i}]['content'] verbatim; trsi_jax "
                                 "needs a ChatML-style (Qwen) template")
            cursor = at + len(content)
            continue
        start = text.find(IM_START, cursor)
        close = text.find(IM_END, start) if start >= 0 else -1
        if close < 0:
            raise ValueError(f"the chat template renders messages[{i}] (assistant) without an "
                             f"'{IM_START}' ... '{IM_END}' block; trsi_jax needs a ChatML-style (Qwen) template")
        plain = IM_START + "assistant\n"
        body = start + len(header if text.startswith(header, start) else plain)
        turn = _Turn(start, min(body, close), close)
        sampled = message.get("tokens")
        if sampled is not None:
            sampled = [int(t) for t in sampled]
            if not sampled:
                raise ValueError(f"messages[{i}] has an empty 'tokens' list")
            turn = _splice(turn, sampled, text, tok, i)
        turns.append(turn)
        cursor = turn.close
    return turns


def _encode(messages: Sequence[dict], tok: Tokenizer, add_generation_prompt: bool) -> Encoded:
    for i, message in enumerate(messages):
        _check(message, i)
    template = _template(tok)
    text = _render(messages, *template, add_generation_prompt)
    turns = _layout(messages, text, tok, _generation_header(*template))
    tokens: list[int] = []
    mask: list[int] = []
    turn_ids: list[int] = []
    ends: list[int] = []

    def emit_text(a: int, b: int, k: int, lo: int = 0, hi: int = -1, close: int = -1) -> int:
        """Tokenizes text[a:b] for turn k; mask 1 on tokens inside [lo, hi); returns the index of the token at `close`."""
        ids, spans = tok.encode_rendered(text[a:b])
        at = -1
        for t, (s, e) in zip(ids, spans):
            if a + s == close:
                at = len(tokens)
            tokens.append(int(t))
            mask.append(int(lo <= a + s and a + e <= hi))
            turn_ids.append(k)
        return at

    pos = 0
    for k, turn in enumerate(turns):
        emit_text(pos, turn.start, k - 1)
        if turn.splice is not None:
            a, pos, ids = turn.splice
            emit_text(turn.start, a, k)
            tokens.extend(ids)
            mask.extend([1] * len(ids))
            turn_ids.extend([k] * len(ids))
            ends.append(len(tokens) - 1)
            continue
        pos = turn.close + len(IM_END)
        lo = len(text) if turn.lost else turn.body
        at = emit_text(turn.start, pos, k, lo, pos, close=turn.close)
        ends.append(at if turn.lost else len(tokens) - 1)
    emit_text(pos, len(text), len(turns) - 1)
    return Encoded(np.asarray(tokens, np.int32), np.asarray(mask, np.int32), np.asarray(turn_ids, np.int32),
                   tuple(ends), tuple(t.reply_start for t in turns))


def encode_chat(messages: Sequence[dict], tok: Tokenizer) -> Encoded:
    """A whole episode as the template renders it (no generation prompt): the training sequence."""
    return _encode(messages, tok, add_generation_prompt=False)


def encode_prompt(messages: Sequence[dict], tok: Tokenizer) -> list[int]:
    """The conversation so far plus the generation prompt: the sampler's input."""
    return _encode(messages, tok, add_generation_prompt=True).tokens_T.tolist()
