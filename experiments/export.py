"""Export a stage's policy as a Hugging Face folder (weights, config, generation config, tokenizer).

    python -m experiments.export runs/demo/rpr-2/checkpoints runs/demo/hf --tokenizer=byte
    python -m experiments.export runs/27b/rpr-2/checkpoints /models/terminal-rsi-27b --tokenizer=/models/qwen3.8-27b

CHECKPOINT is any stage's Orbax folder (its latest step, item `params`; the architecture comes
from the checkpoint's metadata) or an HF folder. The result loads with
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`; generation stops at
`<|im_end|>`. The stage scripts call `export_policy` for `--export_hf=DIR`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

from absl import app, flags, logging

from experiments import common

FLAGS = flags.FLAGS

# Files of an HF tokenizer folder that AutoTokenizer reads (those present are copied).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def save_byte_tokenizer(tokenizer, path: str) -> None:
    """The built-in byte tokenizer as an HF fast tokenizer with the same ids: byte b -> id b
    (byte-level BPE without merges), specials at 256.."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    specials = sorted(tokenizer.special_ids, key=tokenizer.special_ids.get)
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True, normalized=False) for s in specials])
    for s in specials:
        if tok.token_to_id(s) != tokenizer.special_ids[s]:
            raise AssertionError(f"byte tokenizer export: {s} got id {tok.token_to_id(s)}, "
                                 f"want {tokenizer.special_ids[s]}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>",
                                   bos_token=None, unk_token=None)
    fast.save_pretrained(path)


def save_tokenizer(tokenizer, path: str) -> None:
    """Writes `tokenizer` (an HF folder's tokenizer: its files copied; the byte one: rebuilt)."""
    src = getattr(tokenizer, "path", None)
    if src is None:
        save_byte_tokenizer(tokenizer, path)
        return
    copied = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(src, f))]
    if "tokenizer.json" not in copied:
        raise FileNotFoundError(f"tokenizer folder {src} has no tokenizer.json to export")
    for f in copied:
        shutil.copyfile(os.path.join(src, f), os.path.join(path, f))


def export_policy(ckpt_dir: str, out_dir: str, model_cfg, tokenizer, mesh=None) -> str:
    """The latest policy of `ckpt_dir` as an HF folder at `out_dir` (every process must call it)."""
    import jax

    from trsi_jax.models import save_hf
    from trsi_jax.rpr.handoff import load_policy

    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"tokenizer vocab {tokenizer.vocab_size} exceeds the model's {model_cfg.vocab_size}")
    policy, source = load_policy(ckpt_dir, model_cfg, mesh)
    eos = [tokenizer.im_end_id] + ([tokenizer.eos_id] if tokenizer.eos_id != tokenizer.im_end_id else [])
    save_hf(policy, out_dir, eos_token_ids=eos, pad_token_id=tokenizer.pad_id,
            bos_token_id=tokenizer.eos_id)
    if jax.process_index() == 0:
        save_tokenizer(tokenizer, out_dir)
        with open(os.path.join(out_dir, "trsi_source.json"), "w") as f:
            json.dump(source, f, indent=1)
    logging.info("exported %s -> %s", source, out_dir)
    return out_dir


def checkpoint_model_config(ckpt_dir: str):
    """The ModelConfig a stage checkpoint (metadata `model_cfg`) or HF folder was saved with."""
    from trsi_jax.config import ModelConfig
    from trsi_jax.train.checkpoint import Checkpointer, is_hf_folder

    if is_hf_folder(ckpt_dir):
        from trsi_jax.models import config_from_hf
        return config_from_hf(ckpt_dir)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
    try:
        saved = ckpt.metadata().get("model_cfg")
    finally:
        ckpt.close()
    if saved is None:
        raise ValueError(f"checkpoint {ckpt_dir} has no model_cfg in its metadata; export it from the "
                         "stage script with --export_hf and the same --model flags")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in saved.items() if k in known})


def main(argv):
    if len(argv) != 3:
        raise app.UsageError("usage: python -m experiments.export CHECKPOINT OUT_DIR [--tokenizer=...]")
    common.init_runtime()
    from trsi_jax.config import override
    from trsi_jax.rollout import load_tokenizer

    ckpt_dir, out_dir = argv[1], argv[2]
    model_cfg = checkpoint_model_config(ckpt_dir)
    numerics = {k: FLAGS[f"model_cfg.{k}"].value for k in ("dtype", "param_dtype")
                if FLAGS[f"model_cfg.{k}"].present}
    export_policy(ckpt_dir, out_dir, override(model_cfg, numerics), load_tokenizer(FLAGS.tokenizer))
    print(out_dir)


if __name__ == "__main__":
    # Flags only when run as a script: the stage scripts import `export_policy` next to their own.
    flags.DEFINE_string("tokenizer", "byte", "'byte' or the HF tokenizer folder the policy was trained with")
    common.define_runtime_flags()
    app.run(main)
