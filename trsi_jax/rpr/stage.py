"""One RPR stage: collect episodes with the policy, reward them, PPO-update policy and critic.

Per update u: tasks_per_update tasks (a pure function of (seed, u)) x samples_per_task episodes
under the common harness -> infrastructure failures (sandbox or verifier broke) left out and
counted -> SPR/binary outcome reward + FDR per turn (truncated episodes: terminal, or bootstrapped
from the critic with `truncation="bootstrap"`) -> old log-probs and values under the sampling
distribution (temperature, vocab limit) -> advantages by the selected estimator -> PPO epochs (critic alone for the first
`critic_warmup_updates` updates of the stage) -> metrics -> Orbax checkpoint of `params` (the
policy), `critic`, `policy_opt`, `critic_opt`, `fdr_stats` with run metadata. A killed run resumes from
its latest checkpoint; the next update's tasks and sampling seed do not depend on the past.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from tqdm.auto import tqdm

from trsi_jax import rl, sharding
from trsi_jax.agent import make_harness
from trsi_jax.config import ModelConfig, RPRConfig, model_preset
from trsi_jax.metrics import MetricsWriter
from trsi_jax.models import Critic, Qwen
from trsi_jax.rollout import Budgets, ModelPolicy, SampleConfig, run_episodes, summarize
from trsi_jax.rollout.episodes import is_infra_failure
from trsi_jax.rpr.batch import bootstrap_truncated, episodes_to_batch
from trsi_jax.rpr.handoff import checkpoint_source, load_policy, write_handoff
from trsi_jax.train.checkpoint import Checkpointer
from trsi_jax.train.ppo import ITEMS, PPOLearner

CHECKPOINTS = "checkpoints"


@dataclasses.dataclass
class RPRResult:
    updates: int  # updates completed
    resumed_from: int | None
    checkpoint_dir: str
    last_metrics: dict[str, float]


def stage_name(cfg: RPRConfig) -> str:
    return f"rpr-{cfg.stage}"


def task_schedule(cfg: RPRConfig, num_tasks: int, update: int) -> np.ndarray:
    """Indices of the update's tasks, each repeated samples_per_task times: a function of
    (seed, update) only, so a resumed run collects what an uninterrupted one would."""
    rng = np.random.default_rng([cfg.seed, update])
    chosen = rng.choice(num_tasks, size=cfg.tasks_per_update, replace=num_tasks < cfg.tasks_per_update)
    return np.repeat(chosen, cfg.samples_per_task)


def _critic_cfg(cfg: RPRConfig, model_cfg: ModelConfig) -> ModelConfig:
    if not cfg.critic_model:
        return model_cfg
    critic_cfg = model_preset(cfg.critic_model)
    if critic_cfg.vocab_size != model_cfg.vocab_size:
        raise ValueError(f"RPRConfig.critic_model={cfg.critic_model!r} has vocab {critic_cfg.vocab_size}, "
                         f"the policy {model_cfg.vocab_size}: they must read the same tokens")
    return critic_cfg


def _fdr_to_tree(stats: rl.FamilyStats) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in stats._asdict().items()}


def _fdr_from_tree(tree: dict[str, Any]) -> rl.FamilyStats:
    return rl.FamilyStats(**{k: jnp.asarray(v) for k, v in tree.items()})


def _metrics(batch, episodes, scored, adv, ret, ppo_metrics, rollout_sec, warmup) -> dict[str, float]:
    summary = summarize(episodes)["all"]
    pm = batch.policy_mask.astype(bool)
    real = batch.real
    out = {
        "rollout/reward": float(batch.rewards[real].sum(axis=1).mean()),
        "rollout/outcome_reward": float(batch.outcome_rewards[real].mean()),
        "rollout/fdr_reward": float(batch.turn_rewards[real].sum(axis=1).mean()),
        "rollout/strict_success": summary["strict_success"],
        "rollout/process_reward": summary["process_reward"],
        "rollout/infra_failures": float(batch.infra_failures),
        "rollout/truncated": float(batch.truncated[real].sum()),
        "rollout/turns": float(np.mean([e.num_turns for e in episodes])),
        "rollout/parse_errors": float(np.mean([e.parse_errors for e in episodes])),
        "rollout/policy_tokens": float(pm.sum()),
        "rollout/tokens_per_sec": float(batch.mask.sum()) / max(rollout_sec, 1e-9),
        "rollout/seconds": rollout_sec,
        "adv/mean": float(adv[pm].mean()) if pm.any() else 0.0,
        "adv/return_mean": float(ret[pm].mean()) if pm.any() else 0.0,
        "critic/value_mean": float(scored["old_values"][pm].mean()) if pm.any() else 0.0,
        "warmup": float(warmup),
    }
    out.update(ppo_metrics)
    return out


@dataclasses.dataclass
class StageSetup:
    """A stage ready to run: learner (fresh, resumed, or with an inherited critic) and FDR stats."""

    learner: PPOLearner
    fdr_stats: Any
    families: list[str]
    critic_cfg: ModelConfig
    resumed: int | None  # update count of the checkpoint resumed from
    handoff: dict[str, Any]  # where the policy and critic came from
    ckpt: Checkpointer


def setup_rpr(cfg: RPRConfig, model_cfg: ModelConfig, workdir: str, families: Sequence[str], mesh, *,
              init_checkpoint: str | None = None, critic_checkpoint: str | None = None,
              vocab_limit: int = 0) -> StageSetup:
    """Builds policy, critic and optimizers on `mesh`; resumes from `workdir/checkpoints` if it
    holds a checkpoint, else (with `inherit_critic`) restores the previous RPR stage's critic.
    vocab_limit: the tokenizer's vocabulary (ids the sampler can draw); the learner scores
    tokens at the rollout temperature within it."""
    if cfg.inherit_critic and not critic_checkpoint:
        raise ValueError(f"{stage_name(cfg)}: inherit_critic needs critic_checkpoint (the previous RPR "
                         "stage's checkpoint folder), or set --rpr.inherit_critic=false")
    families = sorted(families)
    if init_checkpoint:
        policy, policy_from = load_policy(init_checkpoint, model_cfg, mesh)
    else:
        policy = nnx.jit(lambda: Qwen(model_cfg, rngs=nnx.Rngs(cfg.seed)))()
        policy_from = {"random_init_seed": cfg.seed}
    reference = None
    if cfg.ppo.kl_coef > 0:  # a separate copy: the learner donates the policy's buffers
        reference = load_policy(init_checkpoint, model_cfg, mesh)[0] if init_checkpoint else nnx.clone(policy)
    critic_cfg = _critic_cfg(cfg, model_cfg)
    if cfg.critic_model:
        critic = nnx.jit(lambda: Critic(critic_cfg, rngs=nnx.Rngs(cfg.seed + 1)))()
    else:
        critic = Critic.from_policy(policy, seed=cfg.seed + 1)
    learner = PPOLearner(policy, critic, cfg.ppo, cfg.policy_optim, cfg.critic_optim, mesh, reference=reference,
                         temperature=cfg.temperature, vocab_limit=vocab_limit)
    fdr_stats = rl.FamilyStats.init(len(families))
    ckpt = Checkpointer(os.path.join(workdir, CHECKPOINTS), max_to_keep=cfg.max_to_keep)

    resumed = ckpt.latest_step()
    critic_from: dict[str, Any] = {"policy_backbone": not cfg.critic_model, "critic_model": cfg.critic_model}
    if resumed is not None:
        meta = ckpt.metadata(resumed)
        if meta.get("seed") != cfg.seed or meta.get("families") != families:
            raise ValueError(f"{ckpt.directory} step {resumed} belongs to a run with seed={meta.get('seed')} "
                             f"families={meta.get('families')}, not seed={cfg.seed} families={families}; "
                             "use a fresh workdir")
        names = list(ITEMS)
        restored = ckpt.restore(resumed, items=names + ["fdr_stats"], targets=learner.targets(names))
        learner.load_items({k: restored[k] for k in names})
        fdr_stats = _fdr_from_tree(restored["fdr_stats"])
        logging.info("%s: resumed from update %d in %s", stage_name(cfg), resumed, ckpt.directory)
    elif cfg.inherit_critic:
        critic_from = checkpoint_source(critic_checkpoint, ("critic",))
        names = ["critic"] + (["critic_opt"] if cfg.inherit_critic_opt else [])
        prev = Checkpointer(critic_checkpoint, max_to_keep=None)
        try:
            saved_cfg = prev.metadata(critic_from["step"]).get("critic_cfg")
            if saved_cfg is not None and saved_cfg != dataclasses.asdict(critic_cfg):
                raise ValueError(f"the critic in {critic_checkpoint} was saved with another model config; "
                                 f"set --rpr.critic_model to the one the previous RPR stage used")
            restored = prev.restore(critic_from["step"], items=names, targets=learner.targets(names))
        finally:
            prev.close()
        learner.load_items({k: restored[k] for k in names})
        critic_from["optimizer_state"] = cfg.inherit_critic_opt
    return StageSetup(learner, fdr_stats, families, critic_cfg, resumed,
                      {"policy_from": policy_from, "critic_from": critic_from}, ckpt)


def run_rpr(cfg: RPRConfig, model_cfg: ModelConfig, workdir: str, tasks: Sequence, tokenizer, *,
            init_checkpoint: str | None = None, critic_checkpoint: str | None = None,
            mesh=None, stop_after: int | None = None, progress: bool = True) -> RPRResult:
    """Runs (or resumes) one RPR stage in `workdir`.

    init_checkpoint: the previous stage's checkpoint folder (its policy, item "params");
      None starts from a random policy (tests, smoke runs).
    critic_checkpoint: with `cfg.inherit_critic`, the previous RPR stage's checkpoint folder whose
      `critic` (and with `inherit_critic_opt` its `critic_opt`) is restored onto this mesh.
    stop_after: stop once this many updates are done (simulates a kill in tests).
    """
    if not tasks:
        raise ValueError("run_rpr: no training tasks")
    estimator = rl.get_advantage_estimator(cfg.advantage)
    mesh = mesh if mesh is not None else sharding.make_mesh(cfg.mesh)
    if cfg.top_p < 1:
        logging.warning("%s: top_p=%s: PPO scores tokens under the tempered distribution before the "
                        "nucleus cut, so the ratio's old policy is not exactly the sampler's", stage_name(cfg),
                        cfg.top_p)
    setup = setup_rpr(cfg, model_cfg, workdir, {t.family for t in tasks}, mesh,
                      init_checkpoint=init_checkpoint, critic_checkpoint=critic_checkpoint,
                      vocab_limit=tokenizer.vocab_size)
    learner, fdr_stats, families, ckpt, resumed = (setup.learner, setup.fdr_stats, setup.families,
                                                   setup.ckpt, setup.resumed)
    is_main = jax.process_index() == 0
    if resumed is None:
        write_handoff(workdir, stage_name(cfg), setup.handoff)

    # -- loop --------------------------------------------------------------------------------
    harness = make_harness("common")
    budgets = Budgets(max_turns=cfg.max_turns, max_tokens=cfg.max_len)
    sample_cfg = SampleConfig(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens)
    writer = MetricsWriter(workdir, enabled=is_main)
    start = resumed or 0
    end = cfg.updates if stop_after is None else min(stop_after, cfg.updates)
    metrics: dict[str, float] = {}
    bar = tqdm(total=end, initial=start, desc=stage_name(cfg), unit="update", disable=not (progress and is_main))
    try:
        for update in range(start, end):
            t0 = time.perf_counter()
            chosen = [tasks[i] for i in task_schedule(cfg, len(tasks), update)]
            policy = ModelPolicy(learner.policy(), tokenizer, sample_cfg, max_len=cfg.max_len,
                                 seed=cfg.seed * 1_000_003 + update)
            episodes = run_episodes(policy, chosen, harness, backend=cfg.backend, budgets=budgets,
                                    track_progress=cfg.fdr_beta > 0, concurrency=cfg.concurrency,
                                    show_progress=False)
            rollout_sec = time.perf_counter() - t0
            warmup = update < cfg.critic_warmup_updates
            if all(is_infra_failure(e) for e in episodes):  # nothing to learn from: no step at all
                logging.warning("%s update %d: every episode failed in the sandbox or verifier (%s); "
                                "no PPO step", stage_name(cfg), update + 1, episodes[0].reason)
                metrics = {"rollout/infra_failures": float(len(episodes)), "skipped": 1.0}
            else:
                batch, fdr_stats = episodes_to_batch(
                    episodes, families, fdr_stats, reward=cfg.reward, kappa=cfg.kappa, fdr_beta=cfg.fdr_beta,
                    fdr_clip=cfg.fdr_clip, truncation=cfg.truncation, row_multiple=cfg.ppo.minibatch_size)
                arrays = {"tokens": batch.tokens, "mask": batch.mask, "policy_mask": batch.policy_mask}
                if jax.process_count() > 1:  # every host ran the same episodes; a diverged sandbox is an error
                    from jax.experimental import multihost_utils
                    multihost_utils.assert_equal((arrays, batch.rewards), f"{stage_name(cfg)} update {update + 1}: "
                                                 "hosts' rollout batches differ (non-deterministic sandbox output?)")
                scored = learner.score(arrays)
                rewards = batch.rewards
                if cfg.truncation == "bootstrap":
                    rewards = bootstrap_truncated(rewards, batch.policy_mask, batch.truncated,
                                                  scored["cut_values"], cfg.gamma_turn)
                adv, ret = jax.device_get(estimator(
                    jnp.asarray(rewards), jnp.asarray(scored["old_values"]), jnp.asarray(batch.policy_mask),
                    jnp.asarray(batch.turn_ids), cfg.gamma_tok, cfg.lam_tok, cfg.gamma_turn, cfg.lam_turn))
                ppo_metrics = learner.update({**arrays, **scored, "advantages": adv, "returns": ret},
                                             seed=cfg.seed * 1_000_003 + update, train_policy=not warmup)
                metrics = _metrics(batch, episodes, scored, adv, ret, ppo_metrics, rollout_sec, warmup)
            metrics["update_seconds"] = time.perf_counter() - t0
            done = update + 1
            writer.write(done, metrics)
            bar.update(1)
            bar.set_postfix(success=f"{metrics.get('rollout/strict_success', 0.0):.2f}",
                            reward=f"{metrics.get('rollout/reward', 0.0):.3f}")
            logging.info("%s update %d/%d%s: reward %.3f success %.2f process %.2f clip %.3f ev %.3f "
                         "infra failures %d (%.1fs)", stage_name(cfg), done, cfg.updates,
                         " [critic warm-up]" if warmup else "", metrics.get("rollout/reward", 0.0),
                         metrics.get("rollout/strict_success", 0.0), metrics.get("rollout/process_reward", 0.0),
                         metrics.get("policy/clip_frac", 0.0), metrics.get("critic/explained_variance", 0.0),
                         metrics["rollout/infra_failures"], metrics["update_seconds"])
            if done % cfg.checkpoint_every == 0 or done == cfg.updates:
                ckpt.save(done, {**learner.items(), "fdr_stats": _fdr_to_tree(fdr_stats)}, {
                    "kind": "rpr", "stage": cfg.stage, "seed": cfg.seed, "families": families,
                    "model_cfg": dataclasses.asdict(model_cfg), "critic_cfg": dataclasses.asdict(setup.critic_cfg),
                    "rpr_cfg": dataclasses.asdict(cfg), "metrics": metrics})
    finally:
        bar.close()
        writer.close()
        ckpt.close()
    return RPRResult(updates=max(end, start), resumed_from=resumed, checkpoint_dir=ckpt.directory,
                     last_metrics=metrics)
