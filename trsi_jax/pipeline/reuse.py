"""Whether a finished stage (or evaluation) found in the workdir may be reused on a re-run.

A re-run skips finished work, so a sweep that changes a flag but keeps the workdir would
otherwise report the old result under the new config. Each finished stage records the config
that decides its result (its own, the shared task and model settings, and its upstream stage's
record); a re-run whose config differs stops with the fields that changed and what to delete.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from absl import logging

# How fast or how often, not what: changing these never invalidates a finished stage.
IGNORED = frozenset({"concurrency", "log_every", "checkpoint_every", "remat", "scan_layers", "attn_block",
                     "gdn_chunk_size", "mesh"})


def fingerprint(**parts: Any) -> dict:
    """The given configs (dataclasses, dicts, scalars) as plain JSON, speed and logging knobs dropped."""
    def clean(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            x = dataclasses.asdict(x)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in IGNORED}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.loads(json.dumps(clean(parts), sort_keys=True, default=str))


def differences(recorded: dict, current: dict, prefix: str = "") -> list[str]:
    """'field: old -> new' for every leaf that differs (dotted names)."""
    out = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, "<absent>"), current.get(key, "<absent>")
        if isinstance(old, dict) and isinstance(new, dict):
            out += differences(old, new, f"{prefix}{key}.")
        elif old != new:
            out.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return out


def check_reuse(what: str, recorded: dict | None, current: dict, invalidated: Sequence[str]) -> None:
    """Raises ValueError when `recorded` differs from `current`, naming the changed fields and the
    paths to delete (`invalidated`: this result and everything computed from it)."""
    if recorded is None:
        logging.warning("%s records no config (written by an older version); reused as it is", what)
        return
    diffs = differences(recorded, current)
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise ValueError(f"{what} was run with a different config ({shown}). Use a new --workdir, or delete "
                         f"it and what was computed from it to rerun them: rm -r {' '.join(invalidated)}")
