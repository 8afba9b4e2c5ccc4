"""Stage hand-off: where each stage's policy and critic came from, and how to load them.

Every stage writes `handoff.json` in its workdir, one record per stage name, e.g.
`{"rpr-2": {"policy_from": {"dir": ".../rsr-2/checkpoints", "step": 40, "item": "params"},
"critic_from": {"dir": ".../rpr-1/checkpoints", "step": 6, "item": "critic"}, ...}}`, so a
finished pipeline says exactly which checkpoint each stage started from. Only process 0 writes.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax

from trsi_jax.config import ModelConfig
from trsi_jax.train.checkpoint import Checkpointer, is_hf_folder, restore_policy

HANDOFF = "handoff.json"
# Every stage (bootstrap SFT, RSR, RPR) stores its policy as item "params".
POLICY_ITEM = "params"


def read_handoff(workdir: str) -> dict[str, Any]:
    path = os.path.join(workdir, HANDOFF)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def write_json(path: str, obj: Any) -> None:
    """Writes `obj` as JSON to `path` by atomic rename; only process 0 writes."""
    if jax.process_index() != 0:
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def write_handoff(workdir: str, stage: str, record: dict[str, Any]) -> None:
    """Adds/replaces `stage`'s record in `workdir/handoff.json`."""
    write_json(os.path.join(workdir, HANDOFF), {**read_handoff(workdir), stage: record})


def checkpoint_source(ckpt_dir: str, items: tuple[str, ...]) -> dict[str, Any]:
    """{"dir", "step", "item"}: the latest step of `ckpt_dir` and the first of `items` it holds
    ({"dir", "hf": True} for a Hugging Face model folder)."""
    if is_hf_folder(ckpt_dir):
        return {"dir": os.path.abspath(ckpt_dir), "hf": True}
    ckpt = Checkpointer(ckpt_dir, max_to_keep=None)
    try:
        step = ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {ckpt_dir}: did the previous stage finish?")
        saved = ckpt.item_names(step)
    finally:
        ckpt.close()
    for item in items:
        if item in saved:
            return {"dir": os.path.abspath(ckpt_dir), "step": int(step), "item": item}
    raise KeyError(f"checkpoint {ckpt_dir} step {step} has none of the items {list(items)}; it holds {saved}")


def load_policy(ckpt_dir: str, cfg: ModelConfig, mesh=None):
    """(policy, source) from the latest step of any stage's checkpoint folder."""
    source = checkpoint_source(ckpt_dir, (POLICY_ITEM,))
    policy = restore_policy(ckpt_dir, cfg, mesh=mesh, step=source.get("step"), item=source.get("item", POLICY_ITEM))
    return policy, source
