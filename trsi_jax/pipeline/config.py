"""Pipeline config and presets: which tasks, how to evaluate, and one config per stage."""
from __future__ import annotations

import dataclasses

from trsi_jax.config import (MeshConfig, OptimConfig, PPOConfig, RPRConfig, RSRConfig, SFTConfig, rpr_stage,
                             rsr_stage)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Task selection, evaluation, and one config per stage (each with its own schedules)."""

    families: tuple[str, ...] = ()  # built-in suite families (empty = all)
    train_per_family: int = 4
    heldout_per_family: int = 2
    backend: str = "local"
    seed: int = 0
    max_len: int = 4096  # tokens per episode
    # Held-out evaluation after every stage.
    eval_samples: int = 2  # episodes per task: pass@1 and pass@eval_samples
    eval_temperature: float = 0.7
    eval_max_turns: int = 4
    eval_max_new_tokens: int = 256
    # Bootstrap: SFT on verified oracle demonstrations of the train tasks.
    bootstrap_repeats: int = 4
    bootstrap: SFTConfig = SFTConfig()
    rsr1: RSRConfig = rsr_stage(1)
    rpr1: RPRConfig = rpr_stage(1)
    rsr2: RSRConfig = rsr_stage(2)
    rpr2: RPRConfig = rpr_stage(2)
    mesh: MeshConfig = MeshConfig()



def _small_rsr(stage: int, sft_steps: int, lr: float, **kw) -> RSRConfig:
    return dataclasses.replace(
        rsr_stage(stage), harnesses=("common", "verifier_feedback", "retry"), samples_per_task=1,
        collect_temperature=0.7, runbooks_per_success=2, replays=2, revision_rounds=2,
        sft=SFTConfig(optim=OptimConfig(lr=lr, warmup_steps=sft_steps // 5, total_steps=sft_steps), batch_size=8,
                      eval_fraction=0.0, checkpoint_every=sft_steps, log_every=5), **kw)


def _small_rpr(stage: int, lr: float, **kw) -> RPRConfig:
    return dataclasses.replace(
        rpr_stage(stage), samples_per_task=2, ppo=PPOConfig(epochs=1, minibatch_size=8),
        policy_optim=OptimConfig(lr=lr, schedule="constant"),
        critic_optim=OptimConfig(lr=1e-3, schedule="constant"), **kw)


def _tiny(families: tuple[str, ...], train: int, heldout: int, turns: int, new_tokens: int, bootstrap_steps: int,
          rsr_steps: int, rpr_updates: int, tasks_per_update: int) -> PipelineConfig:
    """The tiny-model pipeline on CPU: every stage at the smallest size that still does its job."""
    episode = dict(max_turns=turns, max_new_tokens=new_tokens, max_len=3072)
    return PipelineConfig(
        families=families, train_per_family=train, heldout_per_family=heldout, max_len=3072,
        eval_samples=2, eval_max_turns=turns, eval_max_new_tokens=new_tokens, bootstrap_repeats=8,
        bootstrap=SFTConfig(optim=OptimConfig(lr=3e-3, warmup_steps=bootstrap_steps // 10, total_steps=bootstrap_steps),
                            batch_size=8, max_len=3072, eval_fraction=0.0, checkpoint_every=bootstrap_steps,
                            log_every=5),
        rsr1=_small_rsr(1, rsr_steps, 1e-3, **episode),
        rpr1=_small_rpr(1, 1e-4, updates=rpr_updates, tasks_per_update=tasks_per_update,
                        critic_warmup_updates=1, **episode),
        rsr2=_small_rsr(2, rsr_steps, 5e-4, **episode),
        rpr2=_small_rpr(2, 5e-5, updates=rpr_updates, tasks_per_update=tasks_per_update,
                        critic_warmup_updates=1, **episode),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1))


PIPELINE_PRESETS: dict[str, PipelineConfig] = {
    # `make demo`: ~10-15 minutes on 2 CPU cores.
    "demo": _tiny(("files", "text", "data"), train=2, heldout=2, turns=3, new_tokens=192,
                  bootstrap_steps=60, rsr_steps=20, rpr_updates=3, tasks_per_update=4),
    # CI smoke test: 2 families, 2 train tasks, 1-2 updates per stage.
    "ci": _tiny(("files", "text"), train=1, heldout=1, turns=2, new_tokens=64,
                bootstrap_steps=4, rsr_steps=2, rpr_updates=2, tasks_per_update=4),
    # Paper-scale defaults (stage presets as defined in trsi_jax.config).
    "full": PipelineConfig(),
}


def pipeline_preset(name: str) -> PipelineConfig:
    if name not in PIPELINE_PRESETS:
        raise ValueError(f"unknown pipeline preset {name!r}; choose one of {sorted(PIPELINE_PRESETS)}")
    return PIPELINE_PRESETS[name]
