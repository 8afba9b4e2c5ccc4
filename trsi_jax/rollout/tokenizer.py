"""Tokenizers behind one small interface: a built-in byte-level one and any HF tokenizer folder.

Both expose the chat specials the Qwen template needs (`<|im_start|>`, `<|im_end|>`,
`<|endoftext|>`) as ids, so chat encoding never depends on how a tokenizer splits special text.
"""
from __future__ import annotations

import os
from typing import Protocol, Sequence

IM_START, IM_END, EOT, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"


class Tokenizer(Protocol):
    vocab_size: int
    im_start_id: int
    im_end_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes 0..255, then specials 256.. (vocab 260, fits the `tiny` preset's 384)."""

    SPECIALS = (EOT, IM_START, IM_END, PAD)

    def __init__(self):
        self.special_ids = {s: 256 + i for i, s in enumerate(self.SPECIALS)}
        self.vocab_size = 256 + len(self.SPECIALS)
        self.eos_id = self.special_ids[EOT]
        self.im_start_id = self.special_ids[IM_START]
        self.im_end_id = self.special_ids[IM_END]
        self.pad_id = self.special_ids[PAD]

    def encode(self, text: str) -> list[int]:
        """Plain text to byte ids; special-token text is encoded as bytes, never as a special."""
        return list(text.encode("utf-8"))

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

    def __init__(self, path: str):
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

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """`"byte"` for the built-in tokenizer, else a path to an HF tokenizer (or model) folder."""
    if name_or_path == "byte":
        return ByteTokenizer()
    return HFTokenizer(name_or_path)
