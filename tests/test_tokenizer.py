"""Byte tokenizer and HF tokenizer folders (a BPE trained here, saved and loaded by path)."""
import json

import pytest

from trsi_jax.config import model_preset
from trsi_jax.rollout.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

CORPUS = [
    "<|im_start|>user\nList the files in /app and count the lines of data.csv<|im_end|>\n",
    '{"analysis": "empty dir", "plan": "run ls", "commands": [{"keystrokes": "ls -la\\n", "duration": 1}]}',
    "grep -c error /var/log/app.log | sort -n | uniq > out.txt; echo done; git commit -m 'fix'",
    "Überprüfe die Datei — naïve café ✓ 日本語 テキスト",
] * 20


def train_bpe(folder, vocab_size=420):
    """A small byte-level BPE with the Qwen chat specials, saved as `folder/tokenizer.json`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_byte_tokenizer_roundtrip_and_fits_tiny_vocab():
    tok = ByteTokenizer()
    assert tok.vocab_size <= model_preset("tiny").vocab_size
    text = "naïve ✓ 日本\n\t{\"a\": 1}"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    specials = {tok.im_start_id, tok.im_end_id, tok.eos_id, tok.pad_id}
    assert len(specials) == 4 and min(specials) >= 256 and max(specials) < tok.vocab_size
    assert tok.decode([tok.im_start_id] + tok.encode("user") + [tok.im_end_id]) == "<|im_start|>user<|im_end|>"
    # special-token text in content stays plain bytes: a user cannot inject a turn boundary
    assert tok.im_end_id not in tok.encode("<|im_end|>")


def test_byte_tokenizer_decodes_broken_utf8_and_rejects_unknown_ids():
    tok = ByteTokenizer()
    assert tok.decode([0xE6, 0x97]) == "\ufffd"  # a truncated multi-byte char, as a sampler may emit
    with pytest.raises(ValueError, match="outside the byte tokenizer"):
        tok.decode([tok.vocab_size])


def test_hf_tokenizer_from_trained_bpe_folder(tmp_path):
    folder = train_bpe(tmp_path / "bpe")
    tok = load_tokenizer(str(folder))
    assert isinstance(tok, HFTokenizer)
    raw = json.loads((folder / "tokenizer.json").read_text())
    assert tok.im_start_id == next(t["id"] for t in raw["added_tokens"] if t["content"] == "<|im_start|>")
    assert tok.eos_id == tok.pad_id == next(t["id"] for t in raw["added_tokens"] if t["content"] == "<|endoftext|>")
    for text in CORPUS[:4] + ["ls -la /tmp\n"]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(CORPUS[2])) < len(CORPUS[2].encode())  # merges learnt: it is really BPE


def test_hf_folder_without_tokenizer_json_loads_through_autotokenizer(tmp_path):
    """A vocab.json + merges.txt folder (no tokenizer.json) encodes like the fast one it came from."""
    from tokenizers import Tokenizer

    fast = HFTokenizer(str(train_bpe(tmp_path / "fast")))
    (tmp_path / "slow").mkdir()
    Tokenizer.from_file(str(tmp_path / "fast" / "tokenizer.json")).model.save(str(tmp_path / "slow"))
    (tmp_path / "slow" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "additional_special_tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}))
    slow = load_tokenizer(str(tmp_path / "slow"))
    assert (slow.im_start_id, slow.im_end_id, slow.eos_id) == (fast.im_start_id, fast.im_end_id, fast.eos_id)
    for text in CORPUS[:4]:
        assert slow.encode(text) == fast.encode(text) and slow.decode(slow.encode(text)) == text


def test_hf_tokenizer_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        HFTokenizer(str(tmp_path / "nowhere"))
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    plain = Tokenizer(models.BPE())
    plain.pre_tokenizer = pre_tokenizers.ByteLevel()
    plain.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    (tmp_path / "plain").mkdir()
    plain.save(str(tmp_path / "plain" / "tokenizer.json"))
    with pytest.raises(ValueError, match=r"plain.*<\|im_start\|>"):
        HFTokenizer(str(tmp_path / "plain"))


def test_load_tokenizer_byte():
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)


def test_byte_tokenizer_encodes_rendered_chat_with_specials_and_char_spans():
    tok = ByteTokenizer(thinking=True)
    assert tok.thinking and tok.chat_template is None
    text = "<|im_start|>user\nnaïve<|im_end|>\n"
    ids, spans = tok.encode_rendered(text)
    assert ids == [tok.im_start_id] + list("user\nnaïve".encode()) + [tok.im_end_id, ord("\n")]
    assert tok.decode(ids) == text
    assert spans[0] == (0, 12) and spans[-2] == (22, 32) and spans[-1] == (32, 33)
    assert spans[8] == spans[9] == (19, 20)  # both bytes of "ï" point at its character
    assert all(text[a:b] == tok.decode([i]) for i, (a, b) in zip(ids, spans) if i >= 256 or i < 128)


def test_chat_template_comes_from_the_folder(tmp_path):
    folder = train_bpe(tmp_path / "bpe")
    assert load_tokenizer(str(folder)).chat_template is None  # built-in ChatML in chat.py
    config = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
              "bos_token": None, "eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(str(folder), thinking=True)
    assert (tok.chat_template, tok.thinking) == ("D", True)
    assert tok.template_vars == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    ids, spans = tok.encode_rendered("<|im_start|>ls -la<|im_end|>")
    assert ids[0] == tok.im_start_id and ids[-1] == tok.im_end_id and spans[0] == (0, 12) and spans[-1] == (18, 28)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    with pytest.raises(ValueError, match=r"bpe/tokenizer_config.json lists chat templates \['tool_use'\]"):
        load_tokenizer(str(folder))
