"""Configs as data: frozen dataclasses, named presets and string overrides.

The library reads no flags. `experiments/flags.py` turns every leaf field of a config into an
absl flag (`--model.hidden_size=128`, `--stage.policy_lr=1e-6`) and calls `override` below.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen3.5-family text model (`qwen3_5` hybrid) or dense `qwen3`, one code path."""

    arch: str = "qwen3_5"  # "qwen3_5" (hybrid Gated DeltaNet + gated attention) or "qwen3" (dense)
    vocab_size: int = 248320
    hidden_size: int = 5120
    num_layers: int = 64
    intermediate_size: int = 17408
    # Full attention.
    num_heads: int = 24
    num_kv_heads: int = 4
    head_dim: int = 256
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    attn_output_gate: bool = True  # q_proj packs [q, gate] per head; output * sigmoid(gate)
    attn_block: int = 128  # queries per attention block: bounds the logits to [B, H, block, S]
    full_attention_interval: int = 4  # every 4th layer is full attention; 1 = all full (qwen3)
    # Gated DeltaNet (linear attention) layers.
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 48
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel: int = 4
    gdn_chunk_size: int = 64  # a power of two
    gdn_impl: str = "jax"  # chunk scan: "jax" (lax.scan) | "pallas" (GPU/TPU kernel; interpret mode on CPU)
    # Norms and heads.
    rms_norm_eps: float = 1e-6
    norm_plus_one: bool = True  # qwen3_5 RMSNorm scales by (1 + w); qwen3 by w
    tie_embeddings: bool = False
    mtp_layers: int = 0  # multi-token-prediction layers (`mtp.*` weights), optional
    max_position_embeddings: int = 262144  # context the checkpoint was trained for (HF config)
    # Numerics and compilation. The precision policy is (param_dtype, dtype): master weights and
    # optimizer state in `param_dtype`, matmuls and activations in `dtype`. fp32 master + bf16
    # compute learns at RPR learning rates (1e-6); bf16 master weights lose updates below 2^-8
    # of a weight's size (optim.py warns).
    dtype: str = "float32"  # compute / activations; "bfloat16" on accelerators
    param_dtype: str = "float32"  # master weights and optimizer state
    remat: str = "none"  # "none" | "full" | "dots" (save matmul outputs)
    scan_layers: bool = True  # scan over identical blocks: compile once per block type

    @property
    def layer_types(self) -> tuple[str, ...]:
        n = self.full_attention_interval
        return tuple("full" if (i + 1) % n == 0 else "linear" for i in range(self.num_layers))

    def __post_init__(self):
        if self.arch not in ("qwen3_5", "qwen3"):
            raise ValueError(f"ModelConfig.arch must be 'qwen3_5' or 'qwen3', got {self.arch!r}")
        if self.num_layers % self.full_attention_interval:
            raise ValueError(
                f"num_layers={self.num_layers} is not a multiple of "
                f"full_attention_interval={self.full_attention_interval}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} not divisible by num_kv_heads={self.num_kv_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.remat not in ("none", "full", "dots"):
            raise ValueError(f"remat must be none|full|dots, got {self.remat!r}")
        if self.gdn_impl not in ("jax", "pallas"):
            raise ValueError(f"gdn_impl must be jax|pallas, got {self.gdn_impl!r}")


@dataclasses.dataclass(frozen=True)
class ChatConfig:
    """How conversations are rendered for the policy (the tokenizer's chat template, else a built-in ChatML)."""

    thinking: bool = False  # the template's reasoning mode (Qwen3 `enable_thinking`); off: empty <think> block


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh shape; -1 on one axis takes the remaining devices."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with warm-up then cosine (or constant) decay; one per model per stage."""

    lr: float = 1e-5
    warmup_steps: int = 0
    schedule: str = "cosine"  # "cosine" | "constant"
    total_steps: int = 1000
    end_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    grad_clip: float = 1.0
    grad_accum: int = 1


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised fine-tuning: loss on assistant tokens, length-bucketed batches, Orbax checkpoints.

    Steps count micro-batches: the run lasts `optim.total_steps * optim.grad_accum` steps.
    """

    optim: OptimConfig = OptimConfig(lr=1e-5, warmup_steps=10, total_steps=200)
    batch_size: int = 8
    max_len: int = 4096
    pad_multiple: int = 64
    bucket_window: int = 16
    seed: int = 0
    eval_fraction: float = 0.05  # share of the examples held out for the eval loss
    eval_every: int = 50
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10


MODEL_PRESETS: dict[str, ModelConfig] = {
    # Qwen3.8-27B: same text architecture as Qwen3.5/3.6-27B (26.9B text parameters).
    # fp32 master weights and optimizer state, bf16 compute.
    "qwen3_8_27b": ModelConfig(dtype="bfloat16", param_dtype="float32", remat="full"),
    # The embedded default: runs on a CPU laptop; vocab fits the shipped 1024-token BPE
    # (trsi_jax/assets/tiny_tokenizer) and the built-in byte tokenizer.
    "tiny": ModelConfig(
        vocab_size=1024, hidden_size=64, num_layers=4, intermediate_size=128,
        num_heads=4, num_kv_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16,
        gdn_chunk_size=32),  # on CPU 12% faster than 64 (bench_sft_step, bench_model)
    # Dense Qwen3 (same code path, full attention everywhere, no output gate).
    "qwen3_0_6b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=1024, num_layers=28, intermediate_size=3072,
        num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1e6, partial_rotary_factor=1.0,
        attn_output_gate=False, full_attention_interval=1, norm_plus_one=False,
        tie_embeddings=True, max_position_embeddings=40960, dtype="bfloat16", param_dtype="float32"),
    "qwen3_32b": ModelConfig(
        arch="qwen3", vocab_size=151936, hidden_size=5120, num_layers=64, intermediate_size=25600,
        num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=1e6, partial_rotary_factor=1.0,
        attn_output_gate=False, full_attention_interval=1, norm_plus_one=False,
        max_position_embeddings=40960, dtype="bfloat16", param_dtype="float32", remat="full"),
    "tiny_qwen3": ModelConfig(
        arch="qwen3", vocab_size=384, hidden_size=64, num_layers=2, intermediate_size=128,
        num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6, partial_rotary_factor=1.0,
        attn_output_gate=False, full_attention_interval=1, norm_plus_one=False),
}


def model_preset(name: str) -> ModelConfig:
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """The PPO update: minibatch epochs, clipped policy/value losses, KL to the reference, entropy."""

    epochs: int = 2
    minibatch_size: int = 8  # episodes (rows) per minibatch; must divide the episodes per update
    clip_eps: float = 0.2
    value_clip_eps: float = 0.2
    kl_coef: float = 0.0  # > 0 keeps a frozen copy of the stage's initial policy as reference
    kl_kind: str = "k3"  # "k1" | "k2" | "k3": which KL each estimates and optimises, see rl.kl_penalty
    entropy_coef: float = 0.0
    whiten_advantages: bool = True  # over the policy tokens of the whole update batch


@dataclasses.dataclass(frozen=True)
class RPRConfig:
    """One RPR stage (PPO with a critic over multi-turn episodes); every field is a flag."""

    stage: int = 1
    updates: int = 50
    seed: int = 0
    # Rollouts: tasks_per_update tasks x samples_per_task episodes under the common harness.
    tasks_per_update: int = 8
    samples_per_task: int = 4
    max_turns: int = 8
    max_new_tokens: int = 512
    max_len: int = 8192  # context tokens per episode
    temperature: float = 1.0
    top_p: float = 1.0
    backend: str = "local"  # sandbox backend: "local" | "docker"
    concurrency: int = 8  # episodes run at once (one batched generate per round)
    # Rewards: SPR (or binary strict success) on the last policy token + FDR per turn.
    reward: str = "spr"  # "spr" | "binary"
    kappa: float = 0.5
    fdr_beta: float = 0.1  # 0 disables the family dense reward (and the per-turn progress probes)
    fdr_clip: float = 3.0
    # Advantages (estimator from trsi_jax.rl.ADVANTAGE_ESTIMATORS).
    advantage: str = "tb_gae"  # "tb_gae" | "gae" | "turn_broadcast"
    gamma_tok: float = 1.0
    lam_tok: float = 1.0
    gamma_turn: float = 0.99
    lam_turn: float = 0.95
    # Episodes cut by the turn limit, wall clock or context (not success): "terminal" grades the
    # cut state like an ending (Terminal-Bench's rule); "bootstrap" treats the cut as a pause: no
    # outcome reward, the last policy token's target gets gamma_turn * V(cut state) instead.
    truncation: str = "terminal"
    ppo: PPOConfig = PPOConfig()
    # Critic: policy backbone + value head, or a smaller preset (critic_model names a MODEL_PRESETS entry).
    critic_model: str = ""
    critic_warmup_updates: int = 2  # the first N updates of the stage train the critic alone
    inherit_critic: bool = False  # restore the critic from the previous RPR stage's checkpoint
    inherit_critic_opt: bool = False  # ... and its optimizer state
    policy_optim: OptimConfig = OptimConfig(lr=1e-6, warmup_steps=0, schedule="constant", grad_clip=1.0)
    critic_optim: OptimConfig = OptimConfig(lr=5e-6, warmup_steps=0, schedule="constant", grad_clip=1.0)
    # Checkpoints and mesh.
    checkpoint_every: int = 1
    max_to_keep: int = 3
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        if self.reward not in ("spr", "binary"):
            raise ValueError(f"RPRConfig.reward must be 'spr' or 'binary', got {self.reward!r}")
        if self.ppo.kl_kind not in ("k1", "k2", "k3"):
            raise ValueError(f"RPRConfig.ppo.kl_kind must be 'k1', 'k2' or 'k3', got {self.ppo.kl_kind!r}")
        if self.truncation not in ("terminal", "bootstrap"):
            raise ValueError(f"RPRConfig.truncation must be 'terminal' or 'bootstrap', got {self.truncation!r}")
        episodes = self.tasks_per_update * self.samples_per_task
        if episodes < 1 or episodes % self.ppo.minibatch_size:
            raise ValueError(
                f"RPRConfig: ppo.minibatch_size={self.ppo.minibatch_size} must divide the episodes per "
                f"update (tasks_per_update * samples_per_task = {episodes})")
        if self.critic_warmup_updates < 0 or self.updates < 1:
            raise ValueError(f"RPRConfig needs updates >= 1 and critic_warmup_updates >= 0, got "
                             f"{self.updates} and {self.critic_warmup_updates}")


# Each stage owns its schedules: RPR-2 starts from an inherited critic, so it warms up briefly
# and refines the policy with a smaller learning rate.
RPR_STAGES: dict[int, RPRConfig] = {
    1: RPRConfig(stage=1),
    2: RPRConfig(
        stage=2, inherit_critic=True, critic_warmup_updates=1,
        policy_optim=OptimConfig(lr=5e-7, schedule="constant", grad_clip=1.0),
        critic_optim=OptimConfig(lr=2e-6, schedule="constant", grad_clip=1.0)),
}


@dataclasses.dataclass(frozen=True)
class RSRConfig:
    """One RSR stage: collect -> plan -> criticise -> execute -> SFT; every field is a flag."""

    stage: int = 1
    seed: int = 0
    roles: str = "deterministic"  # planner/critic/executor: "model" (the policy, prompted) | "deterministic"
    # The executor alone: "" follows `roles`. "model" replays runbooks with the policy itself, so the
    # SFT data is in the policy's own words even where planner and critic are rule-based;
    # "deterministic_one_reply" sends every runbook command in one reply (the bootstrap's format).
    executor: str = ""
    # Collect: samples_per_task episodes per task under each harness (paper: H = 3).
    harnesses: tuple[str, ...] = ("common", "verifier_feedback", "retry")
    samples_per_task: int = 1
    collect_temperature: float = 1.0
    max_turns: int = 8
    max_new_tokens: int = 512
    max_len: int = 8192  # context tokens per episode
    backend: str = "local"
    concurrency: int = 8  # episodes run at once in collect and replay (one batched generate per round)
    # Plan / criticise / execute (paper: K = 4, M = 4 at temperature 0.7; R rounds of revision).
    runbooks_per_success: int = 4
    revision_rounds: int = 3
    replays: int = 4
    replay_temperature: float = 0.7
    role_max_new_tokens: int = 1024  # planner and critic replies (model roles)
    planner_temperature: float = 0.7  # K runbooks per success must differ; the critic decodes greedily
    leak_ngram: int = 8
    sft: SFTConfig = SFTConfig()
    mesh: MeshConfig = MeshConfig()

    def __post_init__(self):
        if self.roles not in ("model", "deterministic"):
            raise ValueError(f"RSRConfig.roles must be 'model' or 'deterministic', got {self.roles!r}")
        if self.executor not in ("", "model", "deterministic", "deterministic_one_reply"):
            raise ValueError(f"RSRConfig.executor must be '', 'model', 'deterministic' or 'deterministic_one_reply', "
                             f"got {self.executor!r}")
        if not self.harnesses or "common" not in self.harnesses:
            raise ValueError(f"RSRConfig.harnesses must include 'common' (the test-time harness), got "
                             f"{self.harnesses!r}")
        for name, v in (("samples_per_task", self.samples_per_task), ("runbooks_per_success",
                        self.runbooks_per_success), ("replays", self.replays), ("leak_ngram", self.leak_ngram)):
            if v < 1:
                raise ValueError(f"RSRConfig.{name} must be >= 1, got {v}")
        if self.revision_rounds < 0:
            raise ValueError(f"RSRConfig.revision_rounds must be >= 0, got {self.revision_rounds}")


# Each RSR stage owns its SFT schedule: RSR-2 fine-tunes an RL-refined policy, so it uses a
# smaller learning rate and fewer steps.
RSR_STAGES: dict[int, RSRConfig] = {
    1: RSRConfig(stage=1, sft=SFTConfig(optim=OptimConfig(lr=1e-5, warmup_steps=10, total_steps=300))),
    2: RSRConfig(stage=2, sft=SFTConfig(optim=OptimConfig(lr=5e-6, warmup_steps=10, total_steps=150))),
}


def rsr_stage(stage: int) -> RSRConfig:
    if stage not in RSR_STAGES:
        raise ValueError(f"unknown RSR stage {stage!r}; choose one of {sorted(RSR_STAGES)}")
    return RSR_STAGES[stage]


def rpr_stage(stage: int) -> RPRConfig:
    if stage not in RPR_STAGES:
        raise ValueError(f"unknown RPR stage {stage!r}; choose one of {sorted(RPR_STAGES)}")
    return RPR_STAGES[stage]


# ---------------------------------------------------------------------------------------------
# String overrides (what flags and sweep files produce).

def _parse(value: str, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if origin is typing.Union or str(origin) == "types.UnionType":
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value.lower() in ("none", "null"):
            return None
        return _parse(value, args[0], where)
    if origin in (tuple, list):
        (elem, *_) = typing.get_args(typ) or (str,)
        items = [v for v in value.split(",") if v.strip()]
        return tuple(_parse(v.strip(), elem, where) for v in items)
    try:
        if typ is bool:
            low = value.lower()
            if low not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(value)
            return low in ("1", "true", "yes")
        if typ is int:
            number = float(value)  # accepts "1e4"
            if number != int(number):
                raise ValueError(value)
            return int(number)
        if typ in (float, str):
            return typ(value)
    except ValueError:
        raise ValueError(f"config field {where}: cannot parse {value!r} as {typ.__name__}") from None
    raise TypeError(f"config field {where}: unsupported type {typ!r}")


def leaf_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted name -> type for every non-dataclass field, recursing into nested dataclasses."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        typ = hints[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(typ):
            out.update(leaf_fields(typ, name + "."))
        else:
            out[name] = typ
    return out


def override(cfg: Any, updates: dict[str, Any]) -> Any:
    """Returns `cfg` with dotted-path fields replaced; string values are parsed by field type."""
    hints = typing.get_type_hints(type(cfg))
    nested: dict[str, dict[str, Any]] = {}
    direct: dict[str, Any] = {}
    for key, value in updates.items():
        head, _, rest = key.partition(".")
        if head not in hints:
            raise ValueError(
                f"{type(cfg).__name__} has no field {head!r} (from override {key!r}); "
                f"fields: {sorted(hints)}")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = _parse(value, hints[head], key) if isinstance(value, str) and hints[head] is not str else value
    for head, sub in nested.items():
        direct[head] = override(getattr(cfg, head), sub)
    return dataclasses.replace(cfg, **direct)
