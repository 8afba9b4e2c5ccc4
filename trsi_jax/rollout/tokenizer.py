"""Tokenizers behind one small interface: a built-in byte-level one and any HF tokenizer folder.

Both expose the chat specials the Qwen template needs (`<|im_start|>`, `<|im_end|>`,
`<|endoftext|>`) as ids, and carry the chat format: the folder's jinja `chat_template` (None for
the byte tokenizer and for folders without one: `chat.py` then uses its built-in Qwen-style one)
and `thinking`, the template's reasoning mode (Qwen3's `enable_thinking`).
"""
from __future__ import annotations

import json
import os
import re
from typing import Protocol, Sequence

IM_START, IM_END, EOT, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"


class Tokenizer(Protocol):
    vocab_size: int
    im_start_id: int
    im_end_id: int
    eos_id: int
    pad_id: int
    chat_template: str | None  # jinja source; None = chat.py's built-in Qwen-style rendering
    template_vars: dict  # special-token names the template may read (`bos_token`, ...)
    thinking: bool  # reasoning mode: passed to the template as `enable_thinking`

    def encode(self, text: str) -> list[int]: ...

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Rendered chat text to ids and each token's character span; special-token text becomes
        its special id, as `apply_chat_template` tokenizes."""

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255, then specials 256.. (vocab 260, fits the `tiny` preset's 384)."""

    SPECIALS = (EOT, IM_START, IM_END, PAD)

    chat_template = None
    template_vars: dict = {}

    def __init__(self, thinking: bool = False):
        self.thinking = thinking
        self.special_ids = {s: 256 + i for i, s in enumerate(self.SPECIALS)}
        self._special_re = re.compile("|".join(map(re.escape, self.SPECIALS)))
        self.vocab_size = 256 + len(self.SPECIALS)
        self.eos_id = self.special_ids[EOT]
        self.im_start_id = self.special_ids[IM_START]
        self.im_end_id = self.special_ids[IM_END]
        self.pad_id = self.special_ids[PAD]

    def encode(self, text: str) -> list[int]:
        """Plain text to byte ids; special-token text is encoded as bytes, never as a special."""
        return list(text.encode("utf-8"))

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids, spans, at = [], [], 0
        for m in [*self._special_re.finditer(text), None]:
            end = m.start() if m else len(text)
            if text[at:end].isascii():
                ids.extend(text[at:end].encode("ascii"))
                spans.extend((i, i + 1) for i in range(at, end))
            else:
                for i in range(at, end):
                    b = text[i].encode("utf-8")
                    ids.extend(b)
                    spans.extend([(i, i + 1)] * len(b))
            if m:
                ids.append(self.special_ids[m.group()])
                spans.append(m.span())
                at = m.end()
        return ids, spans

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text (invalid UTF-8 from sampling becomes U+FFFD); specials by name."""
        names = {v: k for k, v in self.special_ids.items()}
        out, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            if i not in names:
                raise ValueError(f"token id {i} is outside the byte tokenizer's vocab of {self.vocab_size}")
            out.append(names[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """Any Hugging Face tokenizer folder (`tokenizer.json`, else whatever AutoTokenizer reads)."""

    def __init__(self, path: str, thinking: bool = False):
        import tokenizers

        file = os.path.join(path, "tokenizer.json")
        if os.path.isfile(file):
            self._tok = tokenizers.Tokenizer.from_file(file)
        elif os.path.isdir(path):
            import transformers

            self._tok = transformers.AutoTokenizer.from_pretrained(path).backend_tokenizer
        else:
            raise FileNotFoundError(f"no tokenizer folder at {path!r} (expected {file})")
        self.path = path
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = {}
        for name in (IM_START, IM_END, EOT):
            ids[name] = self._tok.token_to_id(name)
        missing = [n for n in (IM_START, IM_END) if ids[n] is None]
        if missing:
            raise ValueError(f"tokenizer at {path!r} lacks the chat special token(s) {missing}; "
                             "the Qwen chat template needs both <|im_start|> and <|im_end|>")
        self.im_start_id, self.im_end_id = ids[IM_START], ids[IM_END]
        self.eos_id = ids[EOT] if ids[EOT] is not None else self.im_end_id
        self.pad_id = self.eos_id
        self.thinking = thinking
        self.chat_template, self.template_vars = _chat_template(path)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_rendered(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), list(enc.offsets)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def _chat_template(path: str) -> tuple[str | None, dict]:
    """The folder's chat template (`chat_template.jinja`, else `tokenizer_config.json`'s
    `chat_template`, the "default" one when it lists several) and its special-token names."""
    config = {}
    if os.path.isfile(file := os.path.join(path, "tokenizer_config.json")):
        with open(file) as f:
            config = json.load(f)
    names = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            names[key] = value
    if os.path.isfile(file := os.path.join(path, "chat_template.jinja")):
        with open(file) as f:
            return f.read(), names
    template = config.get("chat_template")
    if isinstance(template, list):
        by_name = {t.get("name"): t.get("template") for t in template}
        if "default" not in by_name:
            raise ValueError(f"{path}/tokenizer_config.json lists chat templates {sorted(by_name)} but no "
                             "'default' one; name the one to use 'default'")
        template = by_name["default"]
    return template, names


def load_tokenizer(name_or_path: str, thinking: bool = False) -> Tokenizer:
    """`"byte"` for the built-in tokenizer, else a path to an HF tokenizer (or model) folder.

    thinking: the chat template's reasoning mode (Qwen3: `<think>` blocks are the model's to
    write; off, the generation prompt closes an empty one)."""
    if name_or_path == "byte":
        return ByteTokenizer(thinking)
    return HFTokenizer(name_or_path, thinking)
