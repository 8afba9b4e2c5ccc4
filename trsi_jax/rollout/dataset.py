"""Episodes as a versioned Hugging Face `datasets` table (Arrow on disk).

Columns mirror `Episode`; `messages` and `tests` are stored as JSON text. Every row carries
`schema_version`; loading a table written under another version fails with a clear error
instead of feeding misaligned columns to training.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import datasets

from trsi_jax.rollout.episodes import Episode

SCHEMA_VERSION = 1

FEATURES = datasets.Features({
    "schema_version": datasets.Value("int32"),
    "task_id": datasets.Value("string"),
    "family": datasets.Value("string"),
    "harness": datasets.Value("string"),
    "messages": datasets.Value("string"),  # JSON list of {"role", "content"}
    "tokens": datasets.Sequence(datasets.Value("int32")),
    "policy_mask": datasets.Sequence(datasets.Value("int8")),
    "turn_ids": datasets.Sequence(datasets.Value("int32")),
    "logprobs": datasets.Sequence(datasets.Value("float32")),
    "turn_end_positions": datasets.Sequence(datasets.Value("int32")),
    "progress": datasets.Sequence(datasets.Value("float32")),
    "strict": datasets.Value("bool"),
    "partial": datasets.Value("float32"),
    "outcome": datasets.Value("string"),
    "reason": datasets.Value("string"),
    "parse_errors": datasets.Value("int32"),
    "num_turns": datasets.Value("int32"),
    "wall_sec": datasets.Value("float32"),
    "tests": datasets.Value("string"),  # JSON {test name: passed}
})
_JSON = ("messages", "tests")


def episodes_to_dataset(episodes: Sequence[Episode]) -> datasets.Dataset:
    rows = []
    for ep in episodes:
        row = dataclasses.asdict(ep)
        for key in _JSON:
            row[key] = json.dumps(row[key])
        row["schema_version"] = SCHEMA_VERSION
        rows.append(row)
    if not rows:
        return datasets.Dataset.from_dict({k: [] for k in FEATURES}, features=FEATURES)
    return datasets.Dataset.from_list(rows, features=FEATURES)


def dataset_to_episodes(ds: datasets.Dataset, where: str = "dataset") -> list[Episode]:
    missing = sorted(set(FEATURES) - set(ds.column_names))
    if missing:
        raise ValueError(f"{where}: not an episode table of schema v{SCHEMA_VERSION}; missing columns {missing}")
    versions = sorted(set(ds["schema_version"]))
    if versions and versions != [SCHEMA_VERSION]:
        raise ValueError(f"{where}: episode schema_version {versions} but this code reads v{SCHEMA_VERSION}; "
                         "re-collect the episodes or convert them")
    fields = {f.name for f in dataclasses.fields(Episode)}
    episodes = []
    for row in ds:
        for key in _JSON:
            row[key] = json.loads(row[key])
        row["strict"] = bool(row["strict"])
        episodes.append(Episode(**{k: v for k, v in row.items() if k in fields}))
    return episodes


def save_episodes(episodes: Sequence[Episode], path: str) -> None:
    ds = episodes_to_dataset(episodes)
    ds.save_to_disk(path, num_shards=1 if len(ds) == 0 else None)  # 0 shards would not load back


def load_episodes(path: str) -> list[Episode]:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no episode dataset at {path!r}")
    return dataset_to_episodes(datasets.load_from_disk(path), where=path)
