"""HF parity and checkpoint I/O against real tiny `transformers` models (CPU, fp32)."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

from trsi_jax.models import config_from_hf, load_hf, save_hf

VOCAB = 384


def _perturb(model):
    """Random non-default values everywhere (norm weights start at 0/1, which hides bugs)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def hf_qwen35(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        attn_implementation="eager")
    model = _perturb(Qwen3_5ForCausalLM(cfg))
    path = str(tmp_path_factory.mktemp("hf_qwen35"))
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def hf_qwen3(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                      attn_implementation="eager")
    model = _perturb(Qwen3ForCausalLM(cfg))
    path = str(tmp_path_factory.mktemp("hf_qwen3"))
    model.save_pretrained(path)
    return model, path


def _left_padded_batch(lengths, t, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (len(lengths), t))
    mask = np.zeros((len(lengths), t), np.int32)
    for i, n in enumerate(lengths):
        mask[i, t - n:] = 1
    return tokens, mask


def _torch_logits(model, tokens, mask):
    pos = np.maximum(mask.cumsum(1) - 1, 0)
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(pos)).logits.numpy()


def _jax_logits(model, tokens, mask):
    return np.asarray(nnx.jit(lambda m, x, k: m(x, k))(model, jnp.asarray(tokens), jnp.asarray(mask)))


@pytest.mark.parametrize("fixture", ["hf_qwen35", "hf_qwen3"])
def test_logits_match_transformers_with_left_padding(fixture, request):
    hf_model, path = request.getfixturevalue(fixture)
    model = load_hf(path)
    # Real lengths 130 (three GDN chunks, not a multiple of 64), 37 and 1, left-padded to 130.
    tokens, mask = _left_padded_batch([130, 37, 1], 130)
    ours, ref = _jax_logits(model, tokens, mask), _torch_logits(hf_model, tokens, mask)
    real = mask.astype(bool)
    assert np.abs(ours - ref)[real].max() <= 1e-4


def test_config_from_hf(hf_qwen35, hf_qwen3):
    c = config_from_hf(hf_qwen35[1])
    assert (c.arch, c.num_layers, c.full_attention_interval, c.partial_rotary_factor, c.rope_theta) == (
        "qwen3_5", 4, 4, 0.25, 1e7)
    assert (c.linear_num_value_heads, c.linear_key_head_dim, c.attn_output_gate, c.norm_plus_one) == (4, 16, True, True)
    d = config_from_hf(hf_qwen3[1])
    assert (d.arch, d.full_attention_interval, d.attn_output_gate, d.norm_plus_one, d.partial_rotary_factor) == (
        "qwen3", 1, False, False, 1.0)


@pytest.mark.parametrize("fixture", ["hf_qwen35", "hf_qwen3"])
def test_export_round_trip_loads_in_transformers(fixture, request, tmp_path):
    hf_model, path = request.getfixturevalue(fixture)
    model = load_hf(path)
    save_hf(model, str(tmp_path), max_shard_bytes=100_000)  # forces several shards + index
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert type(reloaded) is type(hf_model)
    tokens, mask = _left_padded_batch([9, 5], 9)
    np.testing.assert_allclose(_torch_logits(reloaded, tokens, mask)[mask.astype(bool)],
                               _torch_logits(hf_model, tokens, mask)[mask.astype(bool)], atol=1e-6)
    # And our importer reads our own export back to identical parameters.
    again = load_hf(str(tmp_path))
    for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(a, b)


def _edited_copy(src, dst, edit):
    tensors = load_file(os.path.join(src, "model.safetensors"))
    edit(tensors)
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
        g.write(f.read())
    return str(dst)


def test_bad_checkpoints_name_the_tensor(hf_qwen35, tmp_path):
    src = hf_qwen35[1]
    name = "model.layers.1.linear_attn.in_proj_qkv.weight"
    missing = _edited_copy(src, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(ValueError, match=r"layers\.1\.linear_attn\.in_proj_qkv\.weight"):
        load_hf(missing)
    misshaped = _edited_copy(src, tmp_path / "shape", lambda t: t.update({name: t[name][:-1]}))
    with pytest.raises(ValueError, match=r"layers\.1\.linear_attn\.in_proj_qkv\.weight has shape \(127, 64\), expected \(128, 64\)"):
        load_hf(misshaped)
    extra = _edited_copy(src, tmp_path / "extra", lambda t: t.update({"model.layers.0.mlp.extra.weight": t[name]}))
    with pytest.raises(ValueError, match=r"unexpected tensor.*model\.layers\.0\.mlp\.extra\.weight"):
        load_hf(extra)
    # Known-optional tensors (multi-token prediction, vision tower) are skipped.
    optional = _edited_copy(src, tmp_path / "mtp", lambda t: t.update(
        {"mtp.fc.weight": np.ones((2, 2), np.float32), "model.visual.x": np.ones(3, np.float32)}))
    load_hf(optional)


def test_load_places_tensors_on_their_shardings(hf_qwen35, devices8):
    """Each shard reads only its slice (incl. transposed kernels); values equal a plain load."""
    path = hf_qwen35[1]
    mesh = jax.sharding.Mesh(np.array(devices8), ("x",))
    plain = load_hf(path)
    state = nnx.state(plain, nnx.Param)

    def spec(a):  # shard the last axis when it divides, else replicate
        axes = [None] * a.ndim
        if a.ndim >= 2 and a.shape[-1] % 8 == 0:
            axes[-1] = "x"
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))

    shardings = jax.tree.map(spec, state)
    sharded = load_hf(path, shardings=shardings)
    got = nnx.state(sharded, nnx.Param)
    for a, b, s in zip(jax.tree.leaves(state), jax.tree.leaves(got), jax.tree.leaves(shardings)):
        assert b.sharding == s
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_multimodal_layout_loads_text_part(hf_qwen35, tmp_path):
    """Released Qwen3.5/3.8 checkpoints nest the text config and prefix `model.language_model.`."""
    src = hf_qwen35[1]
    tensors = load_file(os.path.join(src, "model.safetensors"))
    renamed = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = np.ones((4, 3), np.float32)
    renamed["mtp.layers.0.mlp.up_proj.weight"] = np.ones((4, 3), np.float32)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        text = json.load(f)
    with open(tmp_path / "config.json", "w") as f:
        json.dump({"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                   "text_config": text, "vision_config": {}}, f)
    assert config_from_hf(str(tmp_path)) == config_from_hf(src)
    nested, plain = load_hf(str(tmp_path)), load_hf(src)
    for a, b in zip(jax.tree.leaves(nnx.state(nested, nnx.Param)), jax.tree.leaves(nnx.state(plain, nnx.Param))):
        np.testing.assert_array_equal(a, b)
