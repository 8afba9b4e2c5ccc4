"""Trains the shipped tiny BPE tokenizer (`trsi_jax/assets/tiny_tokenizer/`) on the suite's text.

    python -m experiments.make_tokenizer --families=files,text,archives,git --per_family=40

The corpus is what the policy reads and writes in episodes of TRAIN tasks only (never held-out
seeds): the system prompt, each task's first message with its terminal screen, the oracle's
replies, the harness's observations and confirmations, all taken from real oracle episodes.
Byte-level BPE, so any text still encodes; the chat specials are ids 0..3.
A subword vocabulary cuts an episode to about a third of its byte length.
"""
from __future__ import annotations

import json
import os
import tempfile

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", os.path.join("trsi_jax", "assets", "tiny_tokenizer"), "output folder")
flags.DEFINE_list("families", ["files", "text", "archives", "git"], "suite families in the corpus")
flags.DEFINE_integer("per_family", 40, "train tasks per family (train seeds 0..N-1)")
flags.DEFINE_integer("vocab_size", 1024, "total vocabulary, specials included")

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def corpus(families, per_family: int) -> list[str]:
    """Message texts of oracle episodes on train tasks (one string per message)."""
    from trsi_jax.pipeline.bootstrap import demonstrations
    from trsi_jax.pipeline.run import built_in_tasks
    from trsi_jax.rollout import ByteTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tasks = built_in_tasks(os.path.join(tmp, "train"), "train", per_family, families)
        data = demonstrations(tasks, ByteTokenizer(), show_progress=True)
    texts = [m["content"] for e in data.episodes for m in e.messages]
    return texts + ["assistant\n", "user\n", "system\n", "\n"]


def train(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def main(argv):
    del argv
    texts = corpus(FLAGS.families, FLAGS.per_family)
    tok = train(texts, FLAGS.vocab_size)
    os.makedirs(FLAGS.out, exist_ok=True)
    tok.save(os.path.join(FLAGS.out, "tokenizer.json"))
    chars = sum(len(t) for t in texts)
    tokens = sum(len(tok.encode(t).ids) for t in texts)
    print(json.dumps({"vocab_size": tok.get_vocab_size(), "messages": len(texts), "chars": chars,
                      "tokens": tokens, "chars_per_token": round(chars / tokens, 2)}))


if __name__ == "__main__":
    app.run(main)
