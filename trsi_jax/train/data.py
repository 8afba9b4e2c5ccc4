"""SFT batches by length bucketing: the batch for a step is a pure function of (seed, step).

Sequences are not packed: the model's attention and Gated DeltaNet state would run across
example boundaries without segment ids. Instead each epoch shuffles the examples with
`rng(seed, epoch)`, sorts windows of `bucket_window` batches by length so a batch holds similar
lengths, shuffles the batch order, and right-pads each batch to a multiple of `pad_multiple`
(few distinct shapes, few compilations). A resumed run therefore sees exactly the batches an
uninterrupted run would have seen.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One training sequence; `loss_mask[t]` = 1 where token t is an assistant (policy) token."""

    tokens: np.ndarray  # int32 [T]
    loss_mask: np.ndarray  # int32 [T]

    def __post_init__(self):
        tokens = np.asarray(self.tokens, np.int32)
        mask = np.asarray(self.loss_mask, np.int32)
        if tokens.ndim != 1 or tokens.shape != mask.shape:
            raise ValueError(f"SFTExample needs 1-D tokens and loss_mask of one length, got shapes "
                             f"{tokens.shape} and {mask.shape}")
        if len(tokens) < 2:
            raise ValueError(f"SFTExample needs at least 2 tokens, got {len(tokens)}")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "loss_mask", mask)


class BucketedBatches:
    """Right-padded batches {tokens_BT, mask_BT, loss_mask_BT} (int32) indexed by global step."""

    def __init__(self, examples: Sequence[SFTExample], batch_size: int, seed: int, max_len: int,
                 pad_id: int = 0, pad_multiple: int = 64, bucket_window: int = 16):
        if not examples:
            raise ValueError("BucketedBatches got no examples")
        if batch_size < 1 or max_len < 2 or pad_multiple < 1 or bucket_window < 1:
            raise ValueError(f"bad batching sizes: batch_size={batch_size} max_len={max_len} "
                             f"pad_multiple={pad_multiple} bucket_window={bucket_window}")
        # An example whose assistant tokens all lie past max_len would only add zero-loss rows.
        kept = [e for e in examples if e.loss_mask[1:max_len].any()]
        self.no_loss = len(examples) - len(kept)
        if not kept:
            raise ValueError(f"none of the {len(examples)} examples has an assistant token within "
                             f"max_len={max_len}; raise SFTConfig.max_len")
        self.examples = kept
        self.batch_size, self.seed, self.max_len = batch_size, seed, max_len
        self.pad_id, self.pad_multiple, self.bucket_window = pad_id, pad_multiple, bucket_window
        self.lengths = np.array([min(len(e.tokens), max_len) for e in self.examples])
        self.truncated = sum(len(e.tokens) > max_len for e in self.examples)
        self.steps_per_epoch = -(-len(self.examples) // batch_size)
        self._plan: tuple[int, np.ndarray] | None = None  # (epoch, plan) of the last epoch used

    def epoch_plan(self, epoch: int) -> np.ndarray:
        """[steps_per_epoch, batch_size] example indices; every example appears at least once."""
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, self._make_plan(epoch))
        return self._plan[1]

    def _make_plan(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.examples))
        order = np.resize(order, self.steps_per_epoch * self.batch_size)  # wrap to fill the last batch
        window = self.batch_size * self.bucket_window
        chunks = [order[i:i + window] for i in range(0, len(order), window)]
        order = np.concatenate([c[np.argsort(self.lengths[c], kind="stable")] for c in chunks])
        plan = order.reshape(self.steps_per_epoch, self.batch_size)
        return plan[rng.permutation(self.steps_per_epoch)]

    def indices(self, step: int) -> np.ndarray:
        epoch, k = divmod(step, self.steps_per_epoch)
        return self.epoch_plan(epoch)[k]

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return self.collate(self.indices(step))

    def collate(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        longest = int(self.lengths[idx].max())
        T = min(self.max_len, -(-longest // self.pad_multiple) * self.pad_multiple)
        tokens = np.full((len(idx), T), self.pad_id, np.int32)
        mask = np.zeros((len(idx), T), np.int32)
        loss_mask = np.zeros((len(idx), T), np.int32)
        for row, i in enumerate(idx):
            n = self.lengths[i]
            tokens[row, :n] = self.examples[i].tokens[:n]
            mask[row, :n] = 1
            loss_mask[row, :n] = self.examples[i].loss_mask[:n]
        return {"tokens_BT": tokens, "mask_BT": mask, "loss_mask_BT": loss_mask}

    def sequential(self) -> list[dict[str, np.ndarray]]:
        """Every example once, in length order (for evaluation); the last batch is topped up with
        repeats whose loss mask is zeroed, so each example counts once."""
        order = np.argsort(self.lengths, kind="stable")
        n = len(order)
        order = np.resize(order, self.steps_per_epoch * self.batch_size)
        out = []
        for start in range(0, len(order), self.batch_size):
            batch = self.collate(order[start:start + self.batch_size])
            repeats = np.arange(start, start + self.batch_size) >= n
            batch["loss_mask_BT"][repeats] = 0
            out.append(batch)
        return out
