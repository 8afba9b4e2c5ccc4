"""PPO update for RPR: a policy and a critic, each with its own optimizer and jitted step.

All per-token arrays are action-aligned [B, T]: position t holds the action `tokens[t]`, its
log-prob comes from the policy's logits at t-1 and its value V_t from the critic's output at
t-1 (the state is the prefix `tokens[:t]`). Position 0 is never a policy token (a prompt always
precedes the first reply), so nothing is lost by the shift.

One update = `epochs` passes over the batch in shuffled minibatches of `minibatch_size` rows,
each cut to its longest row (`trimmed_width`; the losses are means over real tokens, so the cut
changes nothing but the work);
each minibatch takes one policy step (clipped surrogate - entropy bonus + KL to the reference)
and one critic step (clipped value loss). During the critic warm-up the policy step is skipped
entirely, so the policy parameters and optimizer state stay bitwise unchanged.

One code path for one device and many, like the SFT trainer: parameters are placed by the
sharding rules on a mesh (a 1-device mesh on a laptop), minibatch rows split over (data, fsdp),
steps jitted with explicit in/out shardings and donated buffers.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from trsi_jax import rl, sharding
from trsi_jax.config import OptimConfig, PPOConfig
from trsi_jax.rl.losses import sampling_logits
from trsi_jax.train.optim import make_optimizer

# Checkpoint items of a learner: policy parameters, critic parameters, their optimizer states.
ITEMS = ("params", "critic", "policy_opt", "critic_opt")
# Row-aligned [B, T] inputs of an update (plus ref_logprobs when kl_coef > 0).
BATCH_KEYS = ("tokens", "mask", "policy_mask", "advantages", "returns", "old_logprobs", "old_values")


def token_logprobs(logits_BTV: jax.Array, tokens_BT: jax.Array, temperature: float = 1.0,
                   vocab_limit: int = 0) -> jax.Array:
    """log p(tokens[t] | tokens[:t]) at position t (0 at t = 0), in fp32, under the sampling
    distribution `sampling_logits(logits, temperature, vocab_limit)`."""
    logp_BTV = jax.nn.log_softmax(sampling_logits(logits_BTV[:, :-1], temperature, vocab_limit), axis=-1)
    logp_BT = jnp.take_along_axis(logp_BTV, tokens_BT[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(logp_BT, ((0, 0), (1, 0)))


def action_values(values_BT: jax.Array) -> jax.Array:
    """The critic's per-position outputs moved one step right: V_t is read at t-1."""
    return jnp.pad(values_BT[:, :-1].astype(jnp.float32), ((0, 0), (1, 0)))


def trimmed_width(mask_BT: np.ndarray, minimum: int = 128) -> int:
    """Columns that keep every real token of right-padded rows: the longest row rounded up to the
    next power of two or 1.5 times one (at least `minimum`: few shapes compile), at most the batch's width."""
    longest = int(mask_BT.any(axis=0).nonzero()[0].max(initial=-1)) + 1
    p = 1 << max(longest - 1, 0).bit_length()
    return min(mask_BT.shape[1], max(minimum, p * 3 // 4 if longest <= p * 3 // 4 else p))


def _place(model: nnx.Module, mesh: Mesh):
    """(graphdef, params, rest, param shardings, rest shardings) with the arrays on `mesh`.

    Always fresh buffers (a jitted copy: `device_put` may reuse the source buffer for a
    replicated shard): the steps donate them, and a critic made by `Critic.from_policy` starts
    out sharing the policy's arrays."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    p_sh = sharding.param_shardings(params, mesh, sharding.RULES)
    r_sh = jax.tree.map(lambda _: NamedSharding(mesh, P()), rest)
    copy = lambda tree, sh: jax.jit(lambda t: jax.tree.map(jnp.copy, t), out_shardings=sh)(tree)  # noqa: E731
    return graphdef, copy(params, p_sh), copy(rest, r_sh), p_sh, r_sh


def _opt_init(tx: optax.GradientTransformation, params: Any, p_sh: Any, mesh: Mesh):
    """Optimizer state with moments on the parameters' shardings, step counts replicated."""
    o_sh = sharding.opt_state_shardings(jax.eval_shape(tx.init, params), params, p_sh, mesh)
    return jax.jit(tx.init, out_shardings=o_sh)(params), o_sh


def _step(loss_fn, tx: optax.GradientTransformation, name: str, params, rest, opt_state, mb):
    """One optimizer step on `loss_fn(params, rest, mb) -> (loss, metrics)`."""
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, rest, mb)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics[f"{name}/grad_norm"] = optax.global_norm(grads)
    return params, opt_state, metrics


class PPOLearner:
    """Policy + critic parameters on `mesh`, their optimizer states and the jitted PPO steps.

    `reference` (needed when kl_coef > 0) is a frozen policy whose log-probs anchor the KL term.
    `temperature` and `vocab_limit` are the rollout sampler's: every log-prob, the ratio, the
    entropy and the KL are taken under `sampling_logits(logits, temperature, vocab_limit)`, the
    distribution that actually sampled the tokens.
    `items()` / `load_items()` are what the stage checkpoints.
    """

    def __init__(self, policy: nnx.Module, critic: nnx.Module, cfg: PPOConfig,
                 policy_optim: OptimConfig, critic_optim: OptimConfig, mesh: Mesh, *,
                 reference: nnx.Module | None = None, temperature: float = 1.0, vocab_limit: int = 0):
        if cfg.kl_coef > 0 and reference is None:
            raise ValueError("PPOConfig.kl_coef > 0 needs a reference policy (pass reference=...)")
        shards = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)  # global: spans every process
        if cfg.minibatch_size % shards:
            raise ValueError(f"PPOConfig.minibatch_size={cfg.minibatch_size} must be a multiple of the "
                             f"mesh's data*fsdp size {shards}")
        self.cfg, self.mesh = cfg, mesh
        self.temperature, self.vocab_limit = temperature, vocab_limit
        self.policy_def, self.policy_params, self.policy_rest, p_sh, pr_sh = _place(policy, mesh)
        self.critic_def, self.critic_params, self.critic_rest, c_sh, cr_sh = _place(critic, mesh)
        self.shardings = {"params": p_sh, "critic": c_sh}
        self.policy_tx = make_optimizer(policy_optim)
        self.critic_tx = make_optimizer(critic_optim)
        self.policy_opt, self.shardings["policy_opt"] = _opt_init(self.policy_tx, self.policy_params, p_sh, mesh)
        self.critic_opt, self.shardings["critic_opt"] = _opt_init(self.critic_tx, self.critic_params, c_sh, mesh)
        self.ref_params = self.ref_rest = None
        if cfg.kl_coef > 0:
            ref_def, self.ref_params, self.ref_rest, _, _ = _place(reference, mesh)
            if ref_def != self.policy_def:
                raise ValueError("the reference policy must have the policy's architecture")
        rows = sharding.batch_sharding(mesh, 2)
        # One model per program: XLA:CPU was seen to hang running two long-sequence forwards
        # (blocked attention loops) side by side in one executable.
        self._logprobs = jax.jit(self._logprobs_fn)
        self._values = jax.jit(self._values_fn)
        self._policy_step = jax.jit(
            functools.partial(_step, self._policy_loss, self.policy_tx, "policy"),
            in_shardings=(p_sh, pr_sh, self.shardings["policy_opt"], rows),
            out_shardings=(p_sh, self.shardings["policy_opt"], None), donate_argnums=(0, 2))
        self._critic_step = jax.jit(
            functools.partial(_step, self._critic_loss, self.critic_tx, "critic"),
            in_shardings=(c_sh, cr_sh, self.shardings["critic_opt"], rows),
            out_shardings=(c_sh, self.shardings["critic_opt"], None), donate_argnums=(0, 2))

    # -- models and checkpoint items ------------------------------------------------------------

    def policy(self) -> nnx.Module:
        """The current policy as a module (shares this learner's parameter arrays)."""
        return nnx.merge(self.policy_def, self.policy_params, self.policy_rest)

    def critic(self) -> nnx.Module:
        return nnx.merge(self.critic_def, self.critic_params, self.critic_rest)

    def items(self) -> dict[str, Any]:
        """Checkpoint items (ITEMS): parameters as pure dicts and both optimizer states. The
        policy is "params", the name every stage gives its policy, so `restore_policy` (RSR-2,
        evaluation) reads an RPR checkpoint like any other."""
        return {"params": nnx.to_pure_dict(self.policy_params),
                "critic": nnx.to_pure_dict(self.critic_params),
                "policy_opt": self.policy_opt, "critic_opt": self.critic_opt}

    def targets(self, names) -> dict[str, Any]:
        """Abstract restore targets (shapes, dtypes and this mesh's shardings) for `names`."""
        abstract = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
        trees = {"params": self.policy_params, "critic": self.critic_params,
                 "policy_opt": self.policy_opt, "critic_opt": self.critic_opt}
        out = {}
        for name in names:
            tree = jax.tree.map(abstract, trees[name], self.shardings[name])
            out[name] = nnx.to_pure_dict(tree) if name in ("params", "critic") else tree
        return out

    def load_items(self, items: dict[str, Any]) -> None:
        """Replaces any of the `items()` entries with restored ones (already on this mesh)."""
        unknown = set(items) - set(ITEMS)
        if unknown:
            raise ValueError(f"PPOLearner.load_items: unknown items {sorted(unknown)}; known: {ITEMS}")
        for name, value in items.items():
            if name in ("params", "critic"):
                nnx.replace_by_pure_dict(self.policy_params if name == "params" else self.critic_params, value)
            else:
                if jax.tree.structure(value) != jax.tree.structure(getattr(self, name)):
                    raise ValueError(f"checkpoint item {name!r} does not match this optimizer's state")
                setattr(self, name, value)

    # -- pure functions (jitted) ----------------------------------------------------------------

    def _logits(self, params, rest, mb):
        """The sampling distribution's logits of a policy on one minibatch, fp32 [B, T, V]."""
        logits = nnx.merge(self.policy_def, params, rest)(mb["tokens"], mb["mask"])
        return sampling_logits(logits, self.temperature, self.vocab_limit)

    def _logprobs_fn(self, params, rest, mb):
        """Log-probs of one minibatch's tokens under a policy, no gradients."""
        return token_logprobs(self._logits(params, rest, mb), mb["tokens"])

    def _values_fn(self, params, rest, mb):
        """(action-aligned values [B, T], V of the whole recorded sequence [B]: the critic's output
        at each row's last real token, the value of the state where a truncated episode was cut)."""
        raw_BT = nnx.merge(self.critic_def, params, rest)(mb["tokens"], mb["mask"]).astype(jnp.float32)
        last_B = jnp.sum(mb["mask"], axis=1) - 1
        return action_values(raw_BT), jnp.take_along_axis(raw_BT, last_B[:, None], axis=1)[:, 0]

    def _policy_loss(self, params, rest, mb):
        cfg = self.cfg
        logits = self._logits(params, rest, mb)
        logp = token_logprobs(logits, mb["tokens"])
        mask = mb["policy_mask"]
        loss, metrics = rl.policy_loss(logp, mb["old_logprobs"], mb["advantages"], mask, cfg.clip_eps)
        metrics = {f"policy/{k}": v for k, v in metrics.items()}
        ent, _ = rl.entropy(logits[:, :-1], mask[:, 1:])
        metrics["policy/entropy"] = ent
        loss = loss - cfg.entropy_coef * ent
        if cfg.kl_coef > 0:
            kl, _ = rl.kl_penalty(logp, mb["ref_logprobs"], mask, kind=cfg.kl_kind)
            metrics["policy/ref_kl"] = kl
            loss = loss + cfg.kl_coef * kl
        metrics["policy/loss"] = loss
        return loss, metrics

    def _critic_loss(self, params, rest, mb):
        values = action_values(nnx.merge(self.critic_def, params, rest)(mb["tokens"], mb["mask"]))
        loss, metrics = rl.value_loss(values, mb["old_values"], mb["returns"], mb["policy_mask"],
                                      self.cfg.value_clip_eps)
        metrics = {f"critic/{k}": v for k, v in metrics.items()}
        metrics["critic/loss"] = loss
        return loss, metrics

    # -- host loop ------------------------------------------------------------------------------

    def _put(self, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """A minibatch (identical on every host) -> this host's rows of one global array."""
        rows = next(iter(arrays.values())).shape[0] // jax.process_count()
        lo = jax.process_index() * rows
        return sharding.shard_batch({k: v[lo:lo + rows] for k, v in arrays.items()}, self.mesh)

    @staticmethod
    def _rows(batch: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, np.ndarray]:
        """Rows `idx` of a right-padded batch, [B, T] arrays cut to `trimmed_width` of those rows."""
        width = trimmed_width(batch["mask"][idx])
        return {k: v[idx][:, :width] if v.ndim == 2 else v[idx] for k, v in batch.items()}

    def _minibatches(self, num_rows: int, rng: np.random.Generator | None) -> list[np.ndarray]:
        mb = self.cfg.minibatch_size
        if num_rows % mb:
            raise ValueError(f"PPO batch of {num_rows} rows is not a multiple of minibatch_size={mb}")
        order = np.arange(num_rows) if rng is None else rng.permutation(num_rows)
        return [order[i:i + mb] for i in range(0, num_rows, mb)]

    def score(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Behaviour log-probs and values (and reference log-probs) of a rollout batch, computed
        with the training forward so that the first PPO ratio is exactly 1, plus `cut_values` [B]
        (the value of each row's final state, for bootstrapping truncated episodes)."""
        parts = []
        width = batch["tokens"].shape[1]
        for idx in self._minibatches(batch["tokens"].shape[0], None):
            mb = self._put(self._rows({k: batch[k] for k in ("tokens", "mask")}, idx))
            values, cut = self._values(self.critic_params, self.critic_rest, mb)
            out = {"old_logprobs": self._logprobs(self.policy_params, self.policy_rest, mb),
                   "old_values": values, "cut_values": cut}
            if self.ref_params is not None:
                out["ref_logprobs"] = self._logprobs(self.ref_params, self.ref_rest, mb)
            out = sharding.to_host(out)  # rows live on several hosts in multi-host runs
            parts.append({k: np.pad(v, ((0, 0), (0, width - v.shape[1]))) if v.ndim == 2 else v
                          for k, v in out.items()})
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def update(self, batch: dict[str, np.ndarray], seed: int, *, train_policy: bool) -> dict[str, float]:
        """PPO epochs over `batch` (numpy [B, T] arrays: BATCH_KEYS, plus ref_logprobs when
        kl_coef > 0); the minibatch order is a function of `seed`. Returns metrics averaged over
        the minibatch steps, and tokens/s of the update."""
        keys = BATCH_KEYS + (("ref_logprobs",) if self.cfg.kl_coef > 0 else ())
        missing = [k for k in keys if k not in batch]
        if missing:
            raise ValueError(f"PPO batch is missing {missing}")
        batch = {k: batch[k] for k in keys}
        if self.cfg.whiten_advantages:
            batch["advantages"] = np.asarray(rl.whiten(jnp.asarray(batch["advantages"]),
                                                       jnp.asarray(batch["policy_mask"])))
        rng = np.random.default_rng(seed)
        start, history = time.perf_counter(), []
        for _ in range(self.cfg.epochs):
            for idx in self._minibatches(batch["tokens"].shape[0], rng):
                mb = self._put(self._rows(batch, idx))
                metrics = {}
                if train_policy:
                    self.policy_params, self.policy_opt, metrics = self._policy_step(
                        self.policy_params, self.policy_rest, self.policy_opt, mb)
                self.critic_params, self.critic_opt, critic_metrics = self._critic_step(
                    self.critic_params, self.critic_rest, self.critic_opt, mb)
                history.append({**metrics, **critic_metrics})
        history = sharding.to_host(history)
        seconds = time.perf_counter() - start
        out = {k: float(np.mean([h[k] for h in history])) for k in history[0]}
        out["ppo/tokens_per_sec"] = float(batch["mask"].sum()) * self.cfg.epochs / max(seconds, 1e-9)
        out["ppo/minibatch_steps"] = len(history)
        return out
