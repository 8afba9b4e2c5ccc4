"""One metrics writer: JSONL in the workdir, plus TensorBoard event files."""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping

import numpy as np


def _scalar(v: Any) -> Any:
    if isinstance(v, (np.ndarray, np.generic)) or hasattr(v, "item"):
        v = np.asarray(v)
        if v.size != 1:
            raise ValueError(f"metric must be a scalar, got shape {v.shape}")
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN/inf; keep it visible rather than dropping it
    return v


class MetricsWriter:
    """Appends `{"step", "time", **metrics}` lines to `workdir/metrics.jsonl`.

    Only process 0 writes in multi-host runs (pass `enabled=jax.process_index() == 0`).
    TensorBoard files go to `workdir/tb` when tensorboardX is importable.
    """

    def __init__(self, workdir: str, *, enabled: bool = True, tensorboard: bool = True):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(os.path.join(workdir, "tb"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), "time": time.time()}
        row.update({k: _scalar(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in row.items():
                if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
