"""SFT trainer: next-token loss on assistant tokens, jit step on a mesh, exact resume.

One code path for one device and many: parameters are placed with the sharding rules of
`trsi_jax.sharding` on a mesh (a 1-device mesh by default), the batch is split over the
`data` and `fsdp` axes, and the step is `jax.jit` with explicit in/out shardings and donated
parameter and optimizer buffers. The step counter counts micro-batches; the batch of step s is
a pure function of (seed, s) and the optimizer state (including the gradient-accumulation
buffer) is checkpointed, so a run killed at any point and restarted ends with the same
parameters as one that never stopped.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm

from trsi_jax import sharding as sharding_lib
from trsi_jax.config import MeshConfig, SFTConfig
from trsi_jax.metrics import MetricsWriter
from trsi_jax.train.checkpoint import Checkpointer
from trsi_jax.train.data import BucketedBatches, SFTExample
from trsi_jax.train.optim import make_optimizer, make_schedule


@jax.named_scope("loss")
def sft_loss(logits_BTV: jax.Array, tokens_BT: jax.Array, loss_mask_BT: jax.Array):
    """Mean NLL of token t+1 given the prefix up to t, over targets whose loss_mask is 1.

    The logits at position t predict token t+1, so the target mask is `loss_mask[:, 1:]`: the
    loss covers exactly the assistant tokens, never the prompt or observations that precede them.
    Returns (loss, {"loss", "tokens"}).
    """
    # Targets shifted left instead of logits sliced: slicing [B, T, V] costs a pad + copy of it
    # in the backward pass. The last position gets weight 0.
    z_BTV = logits_BTV.astype(jnp.float32)
    target_BT = jnp.pad(tokens_BT[:, 1:], ((0, 0), (0, 1)))
    w_BT = jnp.pad(loss_mask_BT[:, 1:], ((0, 0), (0, 1))).astype(jnp.float32)
    # logsumexp - target logit: no normalised [B, T, V] copy next to the logits (V is 248k).
    nll_BT = jax.nn.logsumexp(z_BTV, axis=-1) - jnp.take_along_axis(z_BTV, target_BT[..., None], axis=-1)[..., 0]
    count = w_BT.sum()
    loss = (nll_BT * w_BT).sum() / jnp.maximum(count, 1.0)
    return loss, {"loss": loss, "tokens": count}


def _loss_fn(graphdef, params, rest, batch):
    model = nnx.merge(graphdef, params, rest)
    logits_BTV = model(batch["tokens_BT"], batch["mask_BT"])
    return sft_loss(logits_BTV, batch["tokens_BT"], batch["loss_mask_BT"])


def _train_step(graphdef, tx, params, rest, opt_state, batch):
    (_, metrics), grads = jax.value_and_grad(
        lambda p: _loss_fn(graphdef, p, rest, batch), has_aux=True)(params)
    with jax.named_scope("optimizer"):
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state, dict(metrics, grad_norm=optax.global_norm(grads))


def _eval_step(graphdef, params, rest, batch):
    loss, metrics = _loss_fn(graphdef, params, rest, batch)
    return metrics


def default_mesh() -> jax.sharding.Mesh:
    """A 1-device mesh with the standard axes: the single-device case of the sharded code path."""
    return sharding_lib.make_mesh(MeshConfig(data=1, fsdp=1, tensor=1), devices=jax.devices()[:1])


@dataclasses.dataclass
class SFTResult:
    step: int  # micro-steps completed
    train_loss: float  # mean over the last `log_every` steps
    eval_loss: float | None
    resumed_from: int | None
    examples: int
    truncated: int  # examples longer than max_len (cut on the right)
    no_loss: int  # examples left out: no assistant token within max_len


class SFTTrainer:
    """Trains `model` in place on `examples`; checkpoints to `workdir/checkpoints` (items "params"
    and "opt_state", so `restore_policy` loads them; `metadata` is stored with every step)."""

    def __init__(self, model: nnx.Module, cfg: SFTConfig, workdir: str,
                 mesh: jax.sharding.Mesh | None = None, pad_id: int = 0, metadata: dict | None = None):
        self.cfg, self.workdir, self.pad_id = cfg, workdir, pad_id
        self.metadata = dict(metadata or {})
        self.mesh = mesh if mesh is not None else default_mesh()
        shards = math.prod(self.mesh.shape[a] for a in sharding_lib.BATCH_AXES)
        if cfg.batch_size % (shards * jax.process_count()):
            raise ValueError(f"SFTConfig.batch_size={cfg.batch_size} must be a multiple of the mesh's "
                             f"data*fsdp size {shards} times the process count {jax.process_count()}")
        self.total_steps = cfg.optim.total_steps * cfg.optim.grad_accum
        self.schedule = make_schedule(cfg.optim)
        self.tx = make_optimizer(cfg.optim)
        self.graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self.model = model
        p_sh = sharding_lib.param_shardings(params, self.mesh, sharding_lib.RULES)
        r_sh = jax.tree.map(lambda _: NamedSharding(self.mesh, P()), rest)
        self.params = jax.device_put(params, p_sh)
        self.rest = jax.device_put(rest, r_sh)
        o_sh = sharding_lib.opt_state_shardings(jax.eval_shape(self.tx.init, params), params, p_sh, self.mesh)
        self.opt_state = jax.jit(self.tx.init, out_shardings=o_sh)(self.params)
        self.batch_sharding = sharding_lib.batch_sharding(self.mesh, 2)
        self._step_fn = jax.jit(
            functools.partial(_train_step, self.graphdef, self.tx),
            in_shardings=(p_sh, r_sh, o_sh, self.batch_sharding),
            out_shardings=(p_sh, o_sh, None), donate_argnums=(0, 2))
        self._eval_fn = jax.jit(functools.partial(_eval_step, self.graphdef),
                                in_shardings=(p_sh, r_sh, self.batch_sharding))
        self.ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=cfg.keep_checkpoints)

    # -- checkpoints ------------------------------------------------------------------------
    def _targets(self) -> dict[str, Any]:
        abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)  # noqa: E731
        return {"params": nnx.to_pure_dict(jax.tree.map(abstract, self.params)),
                "opt_state": jax.tree.map(abstract, self.opt_state)}

    def _save(self, step: int, metrics: dict[str, Any]) -> None:
        self.ckpt.save(step, {"params": nnx.to_pure_dict(self.params), "opt_state": self.opt_state},
                       {**self.metadata, "kind": "sft", "seed": self.cfg.seed, "total_steps": self.total_steps,
                        **metrics})

    def _resume(self) -> int | None:
        step = self.ckpt.latest_step()
        if step is None:
            return None
        meta = self.ckpt.metadata(step)
        if meta.get("seed") != self.cfg.seed or meta.get("total_steps") != self.total_steps:
            raise ValueError(
                f"{self.ckpt.directory} step {step} belongs to a run with seed={meta.get('seed')} "
                f"total_steps={meta.get('total_steps')}, not seed={self.cfg.seed} "
                f"total_steps={self.total_steps}; use a fresh workdir")
        restored = self.ckpt.restore(step, items=["params", "opt_state"], targets=self._targets())
        nnx.replace_by_pure_dict(self.params, restored["params"])
        self.opt_state = restored["opt_state"]
        return step

    # -- loop -------------------------------------------------------------------------------
    def _put(self, batch: dict[str, np.ndarray]):
        """The global batch (identical on every host) -> this host's rows as one global array."""
        rows = self.cfg.batch_size // jax.process_count()
        lo = jax.process_index() * rows
        return sharding_lib.shard_batch({k: v[lo:lo + rows] for k, v in batch.items()}, self.mesh)

    def evaluate(self, batches: Sequence[dict[str, np.ndarray]]) -> float:
        total, count = 0.0, 0.0
        for batch in batches:
            with jax.set_mesh(self.mesh):  # activates the model's FSDP hooks while tracing
                m = jax.device_get(self._eval_fn(self.params, self.rest, self._put(batch)))
            total += float(m["loss"]) * float(m["tokens"])
            count += float(m["tokens"])
        return total / max(count, 1.0)

    def train(self, examples: Sequence[SFTExample], eval_examples: Sequence[SFTExample] = (),
              stop_after: int | None = None, progress: bool = True) -> SFTResult:
        """Runs to `total_steps` (or until step `stop_after`, to simulate a kill), resuming from
        the latest checkpoint in the workdir. Raises FloatingPointError on a non-finite loss or
        gradient, naming the step, without checkpointing it. The parameter buffers are donated to
        the step, so after an exception rebuild the model from the checkpoint."""
        cfg = self.cfg
        data = BucketedBatches(examples, cfg.batch_size, cfg.seed, cfg.max_len, self.pad_id,
                               cfg.pad_multiple, cfg.bucket_window)
        evals = (BucketedBatches(eval_examples, cfg.batch_size, cfg.seed, cfg.max_len, self.pad_id,
                                 cfg.pad_multiple, cfg.bucket_window).sequential() if eval_examples else [])
        resumed = self._resume()
        start = resumed or 0
        end = self.total_steps if stop_after is None else min(stop_after, self.total_steps)
        writer = MetricsWriter(self.workdir, enabled=jax.process_index() == 0)
        recent: list[float] = []
        eval_loss = None
        bar = tqdm(range(start, end), initial=start, total=self.total_steps, desc="sft",
                   disable=not progress, dynamic_ncols=True)
        try:
            for step in bar:
                with jax.set_mesh(self.mesh):  # activates the model's FSDP hooks while tracing
                    self.params, self.opt_state, metrics = self._step_fn(
                        self.params, self.rest, self.opt_state, self._put(data.batch(step)))
                metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])):
                    raise FloatingPointError(
                        f"SFT step {step + 1}: non-finite loss {metrics['loss']} / grad norm "
                        f"{metrics['grad_norm']}; not checkpointed (last checkpoint: step "
                        f"{self.ckpt.latest_step()} in {self.ckpt.directory})")
                done = step + 1
                recent = (recent + [metrics["loss"]])[-cfg.log_every:]
                metrics["lr"] = float(self.schedule(step // cfg.optim.grad_accum))
                if done % cfg.log_every == 0 or done == end:
                    writer.write(done, {f"train/{k}": v for k, v in metrics.items()})
                    bar.set_postfix(loss=f"{np.mean(recent):.4f}", lr=f"{metrics['lr']:.2e}")
                if evals and (done % cfg.eval_every == 0 or done == self.total_steps):
                    eval_loss = self.evaluate(evals)
                    writer.write(done, {"eval/loss": eval_loss})
                if done % cfg.checkpoint_every == 0 or done == self.total_steps:
                    self._save(done, {"train_loss": float(np.mean(recent))})
            if evals and eval_loss is None:
                eval_loss = self.evaluate(evals)
        finally:
            bar.close()
            writer.close()
            self.ckpt.wait()
        nnx.update(self.model, self.params, self.rest)
        return SFTResult(step=max(end, start), train_loss=float(np.mean(recent)) if recent else float("nan"),
                         eval_loss=eval_loss, resumed_from=resumed, examples=len(examples),
                         truncated=data.truncated, no_loss=data.no_loss)


def split_eval(examples: Sequence[SFTExample], fraction: float, seed: int):
    """(train, eval) split, deterministic in `seed`; eval is empty when fraction * n < 1."""
    n_eval = int(len(examples) * fraction)
    order = np.random.default_rng([seed, 7919]).permutation(len(examples))
    held = set(order[:n_eval].tolist())
    return ([e for i, e in enumerate(examples) if i not in held],
            [e for i, e in enumerate(examples) if i in held])
