"""Orbax checkpoints: several named pytrees plus JSON metadata per step, restored whole or in part.

One step folder holds one item per name (`params`, `opt_state`, `critic`, ...) and `metadata`
(JSON). Orbax writes into a temporary folder and renames it when complete, so a run killed while
saving leaves the previous step intact. Restoring takes an optional abstract target per item
(`jax.ShapeDtypeStruct` leaves with shardings): arrays are read straight onto those shardings,
which may belong to another mesh than the one that saved them. Items without a target come back
as host NumPy arrays in the saved structure.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from trsi_jax.config import ModelConfig

METADATA = "metadata"


class Checkpointer:
    """`CheckpointManager` over `dir`, keeping the newest `max_to_keep` steps."""

    def __init__(self, directory: str, max_to_keep: int | None = 3, *, async_save: bool = False):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, enable_async_checkpointing=async_save)
        self._mgr = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, items: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
        """Writes `items` (name -> pytree of arrays) and `metadata` (JSON-able) as `step`."""
        if METADATA in items:
            raise ValueError(f"item name {METADATA!r} is reserved for the JSON metadata")
        if not items:
            raise ValueError("Checkpointer.save needs at least one item")
        args = {name: ocp.args.PyTreeSave(tree) for name, tree in items.items()}
        args[METADATA] = ocp.args.JsonSave(dict(metadata or {}, step=int(step)))
        self._mgr.save(int(step), args=ocp.args.Composite(**args), force=True)

    def wait(self) -> None:
        """Blocks until an asynchronous save has committed."""
        self._mgr.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._mgr.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._mgr.all_steps())

    def item_names(self, step: int) -> list[str]:
        """Names of the pytree items saved at `step` (metadata excluded)."""
        folder = os.path.join(self.directory, str(step))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"no checkpoint step {step} in {self.directory}; "
                                    f"steps present: {self.all_steps()}")
        return sorted(n for n in os.listdir(folder)
                      if n != METADATA and os.path.isdir(os.path.join(folder, n)) and not n.startswith("_"))

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        step = self.resolve_step(step)
        out = self._mgr.restore(step, args=ocp.args.Composite(**{METADATA: ocp.args.JsonRestore()}))
        return dict(out[METADATA])

    def restore(self, step: int | None = None, items: Sequence[str] | None = None,
                targets: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Returns {name: pytree} for `items` (default: every saved item) plus `"metadata"`.

        `targets[name]` is an abstract pytree (ShapeDtypeStruct leaves with `.sharding`, or
        concrete arrays whose sharding is reused): the item is restored onto those shardings and
        dtypes. Items without a target are returned as NumPy arrays on the host.
        """
        step = self.resolve_step(step)
        saved = self.item_names(step)
        targets = dict(targets or {})
        names = list(items) if items is not None else sorted(set(saved) | set(targets))
        for name in list(names) + list(targets):
            if name not in saved:
                raise KeyError(f"checkpoint {self.directory}/{step} has no item {name!r}; items: {saved}")
        args = {}
        for name in names:
            if name in targets:
                target = targets[name]
                args[name] = ocp.args.PyTreeRestore(
                    item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target))
            else:
                tree = self._saved_tree(step, name)
                args[name] = ocp.args.PyTreeRestore(
                    restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree))
        args[METADATA] = ocp.args.JsonRestore()
        out = self._mgr.restore(step, args=ocp.args.Composite(**args))
        return {name: out[name] for name in [*names, METADATA]}

    def close(self) -> None:
        self._mgr.wait_until_finished()
        self._mgr.close()

    def resolve_step(self, step: int | None) -> int:
        """`step`, or the latest one when None; FileNotFoundError when there is no checkpoint."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        return int(step)

    def _saved_tree(self, step: int, name: str):
        handler = ocp.PyTreeCheckpointHandler()
        meta = handler.metadata(epath.Path(self.directory) / str(step) / name)
        return meta.tree


# ---------------------------------------------------------------------------------------------
# Policy helpers: a Qwen's parameters as item "params", its config in the metadata.

def _param_targets(abstract_params: nnx.State, mesh: jax.sharding.Mesh | None) -> dict:
    """Pure-dict tree of ShapeDtypeStructs carrying the shardings the params should land on."""
    if mesh is None:
        shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                                 abstract_params)
    else:
        from trsi_jax import sharding as sharding_lib
        shardings = sharding_lib.param_shardings(abstract_params, mesh, sharding_lib.RULES)
    with_shardings = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params, shardings)
    return nnx.to_pure_dict(with_shardings)


def save_model(ckpt_dir: str, model: nnx.Module, step: int = 0, metadata: Mapping[str, Any] | None = None,
               cfg: ModelConfig | None = None) -> None:
    """Saves `model`'s `nnx.Param`s as item "params" (and `cfg` in the metadata) at `step`."""
    params = nnx.state(model, nnx.Param)
    meta = dict(metadata or {})
    if cfg is not None:
        meta["model_cfg"] = dataclasses.asdict(cfg)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
    ckpt.save(step, {"params": nnx.to_pure_dict(params)}, meta)
    ckpt.close()


# Numerics, compilation and context choices a checkpoint does not pin.
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "scan_layers", "attn_block", "gdn_chunk_size", "gdn_impl",
                  "max_position_embeddings")


def _check_same_model(saved: dict, cfg: ModelConfig, where: str) -> None:
    diff = {k: (saved.get(k), v) for k, v in dataclasses.asdict(cfg).items()
            if k not in RUNTIME_FIELDS and saved.get(k) != v}
    if diff:
        raise ValueError(f"{where} was saved with another model config; differing fields (saved, requested): {diff}")


def is_hf_folder(path: str) -> bool:
    """A Hugging Face model folder: config.json plus model.safetensors or its index."""
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        os.path.isfile(os.path.join(path, f)) for f in ("model.safetensors", "model.safetensors.index.json"))


def restore_policy(ckpt_dir: str, cfg: ModelConfig, mesh: jax.sharding.Mesh | None = None,
                   step: int | None = None, item: str = "params"):
    """A `Qwen(cfg)` whose parameters come from `ckpt_dir` (item `item`), placed on `mesh`.

    `ckpt_dir` is an Orbax folder or a Hugging Face model folder (`is_hf_folder`; each tensor
    slice is read straight onto its device). The model is built abstractly (no random init of
    the weights), so the only weight memory used is the restored one. A checkpoint saved with
    another architecture is refused; numerics (`RUNTIME_FIELDS`) come from `cfg`.
    """
    from trsi_jax.models import Qwen

    abstract = nnx.eval_shape(lambda: Qwen(cfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_params, abstract_rest = nnx.split(abstract, nnx.Param, ...)
    if is_hf_folder(ckpt_dir):
        from trsi_jax.models.hf_io import config_from_hf, load_hf

        _check_same_model(dataclasses.asdict(config_from_hf(ckpt_dir)), cfg, f"HF folder {ckpt_dir}")
        shardings = None
        if mesh is not None:
            from trsi_jax import sharding as sharding_lib
            shardings = sharding_lib.param_shardings(abstract_params, mesh, sharding_lib.RULES)
        return load_hf(ckpt_dir, cfg, shardings=shardings)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
    step = ckpt.resolve_step(step)
    saved_cfg = ckpt.metadata(step).get("model_cfg")
    if saved_cfg is not None:
        _check_same_model(saved_cfg, cfg, f"checkpoint {ckpt_dir} step {step}")
    restored = ckpt.restore(step, items=[item], targets={item: _param_targets(abstract_params, mesh)})
    ckpt.close()
    nnx.replace_by_pure_dict(abstract_params, restored[item])
    if jax.tree.leaves(abstract_rest):  # non-parameter state (e.g. rng counters): fresh values
        rest = jax.jit(lambda: nnx.split(Qwen(cfg, rngs=nnx.Rngs(0)), nnx.Param, ...)[2])()
    else:
        rest = abstract_rest
    return nnx.merge(graphdef, abstract_params, rest)
