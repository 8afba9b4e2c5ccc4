"""Hugging Face checkpoints <-> Qwen: `config_from_hf`, `load_hf`, `save_hf`.

One name table maps HF tensors (after stripping `model.language_model.` / `model.`) to NNX
parameter paths, layer i to (stack, slot) and the layout change (torch Linear [out, in] ->
kernel [in, out]; conv1d [C, 1, K] -> [K, C]). Loading reads each tensor slice with
`safe_open(...).get_slice` inside `jax.make_array_from_callback`, so every device shard reads
only its part and the full model never sits on the host. `mtp.*` (multi-token prediction) and
vision-tower tensors are skipped: this port serves the text model only.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from trsi_jax.config import ModelConfig
from trsi_jax.models.qwen import Qwen
from trsi_jax.sharding import to_host

_PREFIX = re.compile(r"^(model\.language_model\.|model\.)")
_OPTIONAL = re.compile(r"^(mtp\.|model\.visual\.|visual\.|model\.mtp\.)")
# Per-layer tensors: (HF suffix, our path inside the layer, layout). "T" = transpose, "conv" = [C,1,K] -> [K,C].
_LAYER_TABLE = {
    "both": [("input_layernorm.weight", ("input_layernorm", "scale"), "id"),
             ("post_attention_layernorm.weight", ("post_attention_layernorm", "scale"), "id")]
    + [(f"mlp.{p}.weight", ("mlp", p, "kernel"), "T") for p in ("gate_proj", "up_proj", "down_proj")],
    "full": [(f"self_attn.{p}.weight", ("self_attn", p, "kernel"), "T") for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    + [(f"self_attn.{p}.weight", ("self_attn", p, "scale"), "id") for p in ("q_norm", "k_norm")],
    "linear": [(f"linear_attn.{p}.weight", ("linear_attn", p, "kernel"), "T")
               for p in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")]
    + [("linear_attn.conv1d.weight", ("linear_attn", "conv1d"), "conv"),
       ("linear_attn.A_log", ("linear_attn", "A_log"), "id"),
       ("linear_attn.dt_bias", ("linear_attn", "dt_bias"), "id"),
       ("linear_attn.norm.weight", ("linear_attn", "norm", "scale"), "id")],
}


@dataclasses.dataclass(frozen=True)
class _Entry:
    hf_name: str          # without the `model.` prefix for backbone tensors
    path: tuple[str, ...]  # NNX parameter path
    layer: int | None     # slot in a stacked parameter, None for unstacked
    layout: str


def tensor_table(cfg: ModelConfig) -> list[_Entry]:
    """Every HF text tensor the config implies, with where it lives in the NNX model."""
    out = [_Entry("embed_tokens.weight", ("model", "embed_tokens", "embedding"), None, "id"),
           _Entry("norm.weight", ("model", "norm", "scale"), None, "id")]
    if not cfg.tie_embeddings:
        out.append(_Entry("lm_head.weight", ("lm_head", "kernel"), None, "T"))
    counts = {"linear": 0, "full": 0}
    for i, kind in enumerate(cfg.layer_types):
        slot = counts[kind]
        counts[kind] += 1
        for suffix, sub, layout in _LAYER_TABLE["both"] + _LAYER_TABLE[kind]:
            out.append(_Entry(f"layers.{i}.{suffix}", ("model", f"{kind}_layers", *sub), slot, layout))
    return out


def _hf_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    if layout == "T":
        return shape[::-1]
    if layout == "conv":
        return (shape[1], 1, shape[0])
    return shape


def _read(handle, name: str, layout: str, index: tuple[slice, ...]) -> np.ndarray:
    """Reads the HF slice that becomes `index` of our layout."""
    s = handle.get_slice(name)
    if layout == "T":
        return np.asarray(s[index[1], index[0]]).T
    if layout == "conv":
        return np.asarray(s[index[1], 0, index[0]]).T
    return np.asarray(s[index] if index else s[:])


# ---------------------------------------------------------------------------------------------
# Config.

def config_from_hf(path: str) -> ModelConfig:
    """ModelConfig from a HF `config.json` (qwen3_5 text part or dense qwen3); fp32 by default."""
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    c = raw.get("text_config", raw)
    kind = c.get("model_type", raw.get("model_type"))
    rope = c.get("rope_parameters") or {}
    theta = rope.get("rope_theta", c.get("rope_theta"))
    common = dict(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_layers=c["num_hidden_layers"],
        intermediate_size=c["intermediate_size"], num_heads=c["num_attention_heads"],
        num_kv_heads=c["num_key_value_heads"],
        head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
        rms_norm_eps=c["rms_norm_eps"], tie_embeddings=bool(raw.get("tie_word_embeddings", c.get("tie_word_embeddings", False))))
    if c.get("max_position_embeddings"):
        common["max_position_embeddings"] = int(c["max_position_embeddings"])
    if theta is not None:
        common["rope_theta"] = float(theta)
    if c.get("attention_bias"):
        raise ValueError(f"{path}/config.json: attention_bias=true is not supported")
    if kind in ("qwen3_5", "qwen3_5_text"):
        types = c.get("layer_types")
        interval = c.get("full_attention_interval", 4)
        if types:
            interval = types.index("full_attention") + 1
            want = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(len(types))]
            if types != want:
                raise ValueError(f"{path}/config.json: layer_types must repeat (linear x{interval - 1}, full); got {types}")
        return ModelConfig(
            arch="qwen3_5", **common, full_attention_interval=interval,
            partial_rotary_factor=float(rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.25))),
            attn_output_gate=True, norm_plus_one=True,
            linear_num_key_heads=c["linear_num_key_heads"], linear_num_value_heads=c["linear_num_value_heads"],
            linear_key_head_dim=c["linear_key_head_dim"], linear_value_head_dim=c["linear_value_head_dim"],
            linear_conv_kernel=c["linear_conv_kernel_dim"])
    if kind == "qwen3":
        if c.get("use_sliding_window"):
            raise ValueError(f"{path}/config.json: use_sliding_window=true is not supported")
        return ModelConfig(arch="qwen3", **common, partial_rotary_factor=1.0, attn_output_gate=False,
                           full_attention_interval=1, norm_plus_one=False)
    raise ValueError(f"{path}/config.json: model_type {kind!r} is not qwen3_5 / qwen3_5_text / qwen3")


def _hf_config(cfg: ModelConfig, token_ids: dict[str, int]) -> dict:
    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
        intermediate_size=cfg.intermediate_size, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps,
        hidden_act="silu", tie_word_embeddings=cfg.tie_embeddings, attention_bias=False,
        max_position_embeddings=cfg.max_position_embeddings, dtype=cfg.param_dtype, **token_ids)
    if cfg.arch == "qwen3":
        return dict(common, model_type="qwen3", architectures=["Qwen3ForCausalLM"],
                    rope_parameters=dict(rope_type="default", rope_theta=cfg.rope_theta))
    return dict(
        common, model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"],
        layer_types=["full_attention" if t == "full" else "linear_attention" for t in cfg.layer_types],
        rope_parameters=dict(rope_type="default", rope_theta=cfg.rope_theta,
                             partial_rotary_factor=cfg.partial_rotary_factor),
        linear_num_key_heads=cfg.linear_num_key_heads, linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim, linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel)


# ---------------------------------------------------------------------------------------------
# Import.

def _checkpoint_files(path: str) -> dict[str, str]:
    """HF tensor name -> safetensors file, from an index or the single `model.safetensors`."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
    with safe_open(single, "np") as f:
        return {k: single for k in f.keys()}


def _param_leaves(abstract_state):
    """[(path tuple, leaf)] in tree order, paths without the Variable's `.value`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    paths = [tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in p if not (
        isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value")) for p, _ in flat]
    return paths, [leaf for _, leaf in flat], treedef


def load_hf(path: str, cfg: ModelConfig | None = None, shardings=None) -> Qwen:
    """Builds a Qwen from a HF safetensors folder, each tensor read straight onto its sharding.

    `shardings`: None (one device) or a pytree matching `nnx.state(model, nnx.Param)` of
    `jax.sharding.Sharding`s. Raises ValueError naming any missing, misshaped or unknown tensor.
    """
    cfg = cfg or config_from_hf(path)
    graphdef, abstract, rest = nnx.split(nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
    paths, leaves, treedef = _param_leaves(abstract)
    if shardings is None:
        target_shardings = [jax.sharding.SingleDeviceSharding(jax.devices()[0])] * len(leaves)
    else:
        target_shardings = jax.tree_util.tree_leaves(shardings)
        if len(target_shardings) != len(leaves):
            raise ValueError(f"shardings has {len(target_shardings)} leaves, the model has {len(leaves)} parameters")
    files = _checkpoint_files(path)
    present = {_PREFIX.sub("", k): k for k in files}
    table = tensor_table(cfg)
    expected = {e.hf_name for e in table}
    missing = sorted(expected - set(present))
    if missing:
        raise ValueError(f"{path}: checkpoint lacks {len(missing)} tensor(s): {missing[:8]}")
    tied_extra = {"lm_head.weight"} if cfg.tie_embeddings else set()
    unknown = sorted(present[n] for n in set(present) - expected - tied_extra if not _OPTIONAL.match(present[n]))
    if unknown:
        raise ValueError(f"{path}: unexpected tensor(s) {unknown[:8]} for this config (arch={cfg.arch}, "
                         f"num_layers={cfg.num_layers})")
    by_path: dict[tuple[str, ...], list[_Entry]] = {}
    for e in table:
        by_path.setdefault(e.path, []).append(e)

    arrays = []
    with contextlib.ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, "np")) for f in sorted(set(files.values()))}
        for p, leaf, sharding in zip(paths, leaves, target_shardings):
            entries = by_path.get(p)
            if entries is None:
                raise ValueError(f"model parameter {'/'.join(p)} has no HF tensor in the name table")
            stacked = entries[0].layer is not None
            want = leaf.shape[1:] if stacked else leaf.shape
            for e in entries:
                h = handles[files[present[e.hf_name]]]
                got = tuple(h.get_slice(present[e.hf_name]).get_shape())
                if got != _hf_shape(want, e.layout):
                    raise ValueError(f"{path}: tensor {present[e.hf_name]} has shape {got}, "
                                     f"expected {_hf_shape(want, e.layout)} for {cfg.arch} config")

            def read(index, entries=entries, stacked=stacked, dtype=leaf.dtype):
                if not stacked:
                    e = entries[0]
                    return _read(handles[files[present[e.hf_name]]], present[e.hf_name], e.layout, index).astype(dtype)
                chosen = entries[index[0]]
                return np.stack([_read(handles[files[present[e.hf_name]]], present[e.hf_name], e.layout,
                                       tuple(index[1:])).astype(dtype) for e in chosen])

            arrays.append(jax.make_array_from_callback(leaf.shape, sharding, read))
    return nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, arrays), rest)


# ---------------------------------------------------------------------------------------------
# Export.

def generation_config(eos_token_ids: list[int], pad_token_id: int, bos_token_id: int | None) -> dict:
    """`generation_config.json`: generation stops at any of `eos_token_ids` (<|im_end|> first)."""
    out = dict(eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id)
    if bos_token_id is not None:
        out["bos_token_id"] = bos_token_id
    return out


def save_hf(model: Qwen, path: str, max_shard_bytes: int = 4 << 30, *, eos_token_ids: list[int] | None = None,
            pad_token_id: int | None = None, bos_token_id: int | None = None) -> None:
    """Writes config.json and safetensors shards (plus an index when sharded) that
    `transformers` loads as Qwen3_5ForCausalLM / Qwen3ForCausalLM. Holds at most one shard on host.

    `eos_token_ids` (chat: <|im_end|> then <|endoftext|>), `pad_token_id` and `bos_token_id` go
    into config.json (eos = the first) and generation_config.json, so generation stops at the
    end of a turn. Multi-host: every process must call it (tensors are gathered); process 0 writes.
    """
    cfg = model.cfg
    token_ids = {}
    if eos_token_ids:
        token_ids["eos_token_id"] = int(eos_token_ids[0])
    if pad_token_id is not None:
        token_ids["pad_token_id"] = int(pad_token_id)
    if bos_token_id is not None:
        token_ids["bos_token_id"] = int(bos_token_id)
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(path, exist_ok=True)
    paths, leaves, _ = _param_leaves(nnx.state(model, nnx.Param))
    by_path = dict(zip(paths, leaves))
    written: list[tuple[str, list[str]]] = []  # (temporary file, tensor names)
    shard: dict[str, np.ndarray] = {}
    total = 0

    def flush():
        tmp = os.path.join(path, f"shard-{len(written):05d}.tmp")
        if writer:
            save_file(shard, tmp, metadata={"format": "pt"})
        written.append((tmp, list(shard)))
        shard.clear()

    for e in tensor_table(cfg):
        arr = by_path[e.path]
        arr = to_host(arr[e.layer] if e.layer is not None else arr)
        if e.layout == "T":
            arr = arr.T
        elif e.layout == "conv":
            arr = arr.T[:, None, :]
        if shard and sum(a.nbytes for a in shard.values()) + arr.nbytes > max_shard_bytes:
            flush()
        name = e.hf_name if e.hf_name.startswith("lm_head") else f"model.{e.hf_name}"
        shard[name] = np.ascontiguousarray(arr)
        total += arr.nbytes
    flush()
    if not writer:
        return
    if len(written) == 1:
        os.replace(written[0][0], os.path.join(path, "model.safetensors"))
    else:
        weight_map = {}
        for i, (tmp, names) in enumerate(written):
            fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors"
            os.replace(tmp, os.path.join(path, fname))
            weight_map.update({k: fname for k in names})
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(_hf_config(cfg, token_ids), f, indent=1)
    if eos_token_ids:
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump(generation_config(eos_token_ids, token_ids.get("pad_token_id"), bos_token_id), f, indent=1)
