"""Seeds, splits and `build_suite`: generated TaskSpecs written as TB2 task folders.

Seeds: split "train" uses seeds start .. start+N-1, "heldout" adds HELDOUT_OFFSET, so the splits never share a
task as long as start + N <= HELDOUT_OFFSET. Same seed -> byte-identical folder.
"""
from __future__ import annotations

import os
from typing import Sequence

from sandboxes.suite.families import FAMILIES
from sandboxes.suite.spec import TaskSpec, write_task

HELDOUT_OFFSET = 1_000_000
SPLITS = ("train", "heldout")


def split_seeds(split: str, per_family: int, start: int = 0) -> range:
    """The seeds of `split`: train seeds lie in [0, HELDOUT_OFFSET), heldout seeds at or above it."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} must be one of {SPLITS}")
    if per_family < 0 or start < 0 or start + per_family > HELDOUT_OFFSET:
        raise ValueError(f"need 0 <= start and start + per_family <= {HELDOUT_OFFSET}; got start={start}, "
                         f"per_family={per_family}")
    offset = HELDOUT_OFFSET if split == "heldout" else 0
    return range(offset + start, offset + start + per_family)


def make_task(family: str, seed: int) -> TaskSpec:
    """The TaskSpec of one family at one seed."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[family](seed)


def build_suite(out_dir: str, split: str = "train", per_family: int = 10, families: Sequence[str] | None = None,
                start: int = 0) -> list[str]:
    """Write `per_family` tasks of every family (or of `families`) for `split` into `out_dir`; return their paths."""
    names = list(FAMILIES) if families is None else list(families)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; known: {sorted(FAMILIES)}")
    os.makedirs(out_dir, exist_ok=True)
    return [write_task(make_task(f, s), out_dir) for f in names for s in split_seeds(split, per_family, start)]
