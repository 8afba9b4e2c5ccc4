"""Ahead-of-time plan of a training step on a mesh that this machine does not have.

The step is built abstractly (no weight is allocated), lowered and compiled for N fake CPU
devices, and XLA reports its per-device memory; FLOPs come from the step's jaxpr (scan trip
counts included) beside XLA's own count and the analytic 6*N*tokens. Run:

    python -m experiments.plan --model=qwen3_8_27b --mesh=fsdp=64 --seq_len=4096 --batch=64 \
        --stage=sft --chip=v5p
    python -m experiments.plan --model=qwen3_8_27b --mesh=data=2,fsdp=32,tensor=4 --seq_len=4096 \
        --batch=128 --stage=rpr --chip=v5p

The 27B step (scanned layers, full remat) compiles in 2-4 minutes on 2 CPU cores.

`--stage=sft`: one RSR step (policy forward + masked CE + backward + AdamW).
`--stage=rpr`: one PPO step: reference-policy forward, policy clipped surrogate + KL, critic
clipped value loss, AdamW on both.
"""
from __future__ import annotations


if __name__ == "__main__":  # the fake device count must be set before jax is imported
    from experiments import fake_devices

    fake_devices.from_argv()

import dataclasses  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.extend as jex  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from experiments import common  # noqa: E402
from trsi_jax import rl  # noqa: E402
from trsi_jax import sharding as sharding_lib  # noqa: E402
from trsi_jax.config import MeshConfig, ModelConfig, OptimConfig, PPOConfig  # noqa: E402
from trsi_jax.train import sft  # noqa: E402
from trsi_jax.train.optim import make_optimizer  # noqa: E402
from trsi_jax.train.ppo import action_values, token_logprobs  # noqa: E402

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Chip:
    peak_tflops: float  # dense bf16 matmul peak per chip
    hbm_gb: float


CHIPS = {
    "v4": Chip(275, 32), "v5e": Chip(197, 16), "v5p": Chip(459, 95), "v6e": Chip(918, 32),
    "a100": Chip(312, 80), "h100": Chip(989, 80), "h200": Chip(989, 141), "b200": Chip(2250, 192),
}

# ---------------------------------------------------------------------------------------------
# FLOPs from the jaxpr: XLA's cost analysis counts a while-loop body once, so a scanned model's
# step would be undercounted by the number of layers. Walking the jaxpr multiplies scan bodies
# by their trip count.


def _dot_flops(eqn) -> float:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lhs_contract)


def _conv_flops(eqn) -> float:
    rhs = eqn.invars[1].aval.shape
    spec = eqn.params["dimension_numbers"].rhs_spec  # (out_feature, in_feature, *spatial)
    per_output = rhs[spec[1]] * math.prod(rhs[d] for d in spec[2:])
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * per_output


def jaxpr_flops(jaxpr, loops_once: bool = False) -> float:
    """Matmul/conv FLOPs of a (closed) jaxpr; scan bodies times their length unless
    `loops_once` (what XLA's cost analysis does), the costliest branch of a cond."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "conv_general_dilated":
            total += _conv_flops(eqn)
        elif name == "cond":
            total += max(jaxpr_flops(b, loops_once) for b in eqn.params["branches"])
        else:
            inner = sum(jaxpr_flops(v, loops_once) for v in eqn.params.values()
                        if isinstance(v, (jex.core.Jaxpr, jex.core.ClosedJaxpr)))
            if name == "scan" and not loops_once:
                inner *= eqn.params["length"]
            total += inner
    return total


def count_flops(fn: Callable, *args, loops_once: bool = False) -> float:
    """Global (unsharded) matmul FLOPs of `fn(*args)`; args may be ShapeDtypeStructs."""
    return jaxpr_flops(jax.make_jaxpr(fn)(*args), loops_once)


# ---------------------------------------------------------------------------------------------
# Abstract train steps: ShapeDtypeStructs carrying shardings, never allocated.


@dataclasses.dataclass
class StepSpec:
    """A train step with abstract sharded arguments, what `plan_step` lowers and compiles."""

    fn: Callable
    args: tuple  # pytrees of ShapeDtypeStructs with shardings
    kinds: tuple[str, ...]  # per argument: "params" | "frozen" | "opt" | "batch" | "rest"
    donate: tuple[int, ...]
    out_shardings: tuple
    params: int  # trained parameters
    model_flops: float  # 3 x forward per trained model + 1 x forward per frozen one
    analytic_flops: float  # 6 * N * tokens per trained model + 2 * N * tokens per frozen one


def _with_shardings(tree, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def abstract_state(cls, cfg: ModelConfig, optim: OptimConfig, mesh: Mesh):
    """(graphdef, optimizer, params, opt_state, rest) of `cls(cfg)` as sharded abstract arrays."""
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)
    tx = make_optimizer(optim)
    p_sh = sharding_lib.param_shardings(params, mesh)
    opt = jax.eval_shape(tx.init, params)
    o_sh = sharding_lib.opt_state_shardings(opt, params, p_sh, mesh)
    rest = _with_shardings(rest, jax.tree.map(lambda _: _replicated(mesh), rest))
    return graphdef, tx, _with_shardings(params, p_sh), _with_shardings(opt, o_sh), rest


def matmul_params(params) -> int:
    """Parameters that multiply activations: all but the input embedding table."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return sum(math.prod(x.shape) for p, x in flat if "embed" not in sharding_lib.path_str(p))


def _batch(mesh: Mesh, rows: int, seq_len: int, ints: tuple[str, ...], floats: tuple[str, ...]):
    sh = sharding_lib.batch_sharding(mesh, 2)
    return {**{k: jax.ShapeDtypeStruct((rows, seq_len), jnp.int32, sharding=sh) for k in ints},
            **{k: jax.ShapeDtypeStruct((rows, seq_len), jnp.float32, sharding=sh) for k in floats}}


def _update(tx, loss_fn, params, opt, *extra):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *extra)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss, aux


def sft_step(cfg: ModelConfig, optim: OptimConfig, mesh: Mesh, rows: int, seq_len: int) -> StepSpec:
    """The RSR trainer's own step (`trsi_jax.train.sft`): forward, CE on assistant tokens,
    backward, optimizer update."""
    from trsi_jax.models import Qwen

    graphdef, tx, params, opt, rest = abstract_state(Qwen, cfg, optim, mesh)
    step = functools.partial(sft._train_step, graphdef, tx)  # (params, rest, opt, batch)
    batch = _batch(mesh, rows, seq_len, ("tokens_BT",), ("mask_BT", "loss_mask_BT"))
    fwd = count_flops(functools.partial(sft._loss_fn, graphdef), params, rest, batch)
    return StepSpec(step, (params, rest, opt, batch), ("params", "rest", "opt", "batch"), (0, 2),
                    (_shardings(params), _shardings(opt), None), _nparams(params), 3 * fwd,
                    6.0 * matmul_params(params) * rows * seq_len)


def rpr_step(cfg: ModelConfig, optim: OptimConfig, mesh: Mesh, rows: int, seq_len: int,
             ppo: PPOConfig) -> StepSpec:
    """One PPO step: reference forward, then policy (clipped surrogate - entropy + KL) and critic
    (clipped value loss) updates, each with its own AdamW state; the losses of `trsi_jax.rl`."""
    from trsi_jax.models import Critic, Qwen

    pdef, ptx, pol, pol_opt, prest = abstract_state(Qwen, cfg, optim, mesh)
    cdef, ctx, crit, crit_opt, crest = abstract_state(Critic, cfg, optim, mesh)

    def ref_fwd(r, b):
        return token_logprobs(nnx.merge(pdef, r, prest)(b["tokens"], b["mask"]), b["tokens"])

    def policy_loss(p, b, ref_logp):
        logits = nnx.merge(pdef, p, prest)(b["tokens"], b["mask"])
        logp = token_logprobs(logits, b["tokens"])
        m = b["policy_mask"]
        loss, _ = rl.policy_loss(logp, b["old_logprobs"], b["advantages"], m, ppo.clip_eps)
        ent, _ = rl.entropy(logits[:, :-1], m[:, 1:])
        kl, _ = rl.kl_penalty(logp, ref_logp, m, kind=ppo.kl_kind)
        return loss - ppo.entropy_coef * ent + ppo.kl_coef * kl, ()

    def critic_loss(c, b):
        values = action_values(nnx.merge(cdef, c, crest)(b["tokens"], b["mask"]))
        return rl.value_loss(values, b["old_values"], b["returns"], b["policy_mask"], ppo.value_clip_eps)[0], ()

    def step(p, c, r, po, co, b):
        ref_logp = jax.lax.stop_gradient(ref_fwd(r, b))
        p, po, pl, _ = _update(ptx, policy_loss, p, po, b, ref_logp)
        c, co, cl, _ = _update(ctx, critic_loss, c, co, b)
        return p, c, po, co, pl, cl

    batch = _batch(mesh, rows, seq_len, ("tokens",),
                   ("mask", "policy_mask", "advantages", "returns", "old_logprobs", "old_values"))
    ref_logp = jax.ShapeDtypeStruct((rows, seq_len), jnp.float32)
    fwd = (count_flops(policy_loss, pol, batch, ref_logp)
           + count_flops(critic_loss, crit, batch))
    ref_fwd_flops = count_flops(ref_fwd, pol, batch)
    tokens = rows * seq_len
    analytic = (6.0 * (matmul_params(pol) + matmul_params(crit)) + 2.0 * matmul_params(pol)) * tokens
    return StepSpec(step, (pol, crit, pol, pol_opt, crit_opt, batch),
                    ("params", "params", "frozen", "opt", "opt", "batch"), (0, 1, 3, 4),
                    (_shardings(pol), _shardings(crit), _shardings(pol_opt), _shardings(crit_opt),
                     _replicated(mesh), _replicated(mesh)),
                    _nparams(pol) + _nparams(crit), 3 * fwd + ref_fwd_flops, analytic)


def _nparams(params) -> int:
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _shardings(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def _replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# ---------------------------------------------------------------------------------------------
# Compile and report.


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device memory (bytes, from XLA's memory analysis) and per-step FLOPs of a step."""

    devices: int
    bytes_by_kind: dict  # per device, from the arguments' shardings: params/frozen/opt/batch
    argument_bytes: int  # XLA: all arguments, per device
    output_bytes: int
    alias_bytes: int  # outputs written into donated arguments
    temp_bytes: int  # activations, gradients and other temporaries
    xla_flops: float  # XLA cost analysis, per device, while-loop bodies counted once
    flops_loops_once: float  # jaxpr count with loop bodies once (global), to check against XLA
    step_flops: float  # jaxpr count with trip counts (global), remat recompute included
    model_flops: float
    analytic_flops: float
    params: int
    compile_s: float

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    def step_seconds(self, chip: Chip) -> float:
        """Compute-bound lower bound: every matmul at peak, communication fully overlapped."""
        return self.step_flops / self.devices / (chip.peak_tflops * 1e12)

    def mfu(self, chip: Chip) -> float:
        return self.model_flops / (self.devices * chip.peak_tflops * 1e12 * self.step_seconds(chip))


def per_device_bytes(tree) -> int:
    """Bytes one device holds of a pytree of sharded ShapeDtypeStructs."""
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(tree))


def plan_step(spec: StepSpec, mesh: Mesh) -> Plan:
    """Lowers and compiles `spec` ahead of time on `mesh`; outputs keep the inputs' shardings."""
    start = time.perf_counter()
    jitted = jax.jit(spec.fn, in_shardings=_shardings(spec.args), out_shardings=spec.out_shardings,
                     donate_argnums=spec.donate)
    compiled = jitted.lower(*spec.args).compile()
    compile_s = time.perf_counter() - start
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    by_kind: dict[str, int] = {}
    for kind, arg in zip(spec.kinds, spec.args):
        by_kind[kind] = by_kind.get(kind, 0) + per_device_bytes(arg)
    return Plan(
        devices=mesh.size, bytes_by_kind=by_kind, argument_bytes=mem.argument_size_in_bytes,
        output_bytes=mem.output_size_in_bytes, alias_bytes=mem.alias_size_in_bytes,
        temp_bytes=mem.temp_size_in_bytes, xla_flops=float(cost.get("flops", 0.0)),
        flops_loops_once=count_flops(spec.fn, *spec.args, loops_once=True),
        step_flops=count_flops(spec.fn, *spec.args), model_flops=spec.model_flops,
        analytic_flops=spec.analytic_flops, params=spec.params, compile_s=compile_s)


def format_plan(plan: Plan, chip_name: str, chip: Chip, header: str, tokens: int) -> str:
    """The human-readable report: memory per device, FLOPs per step, step time and MFU."""
    kinds = plan.bytes_by_kind
    fits = plan.peak_bytes <= chip.hbm_gb * GB
    xla_total = plan.xla_flops * plan.devices
    lines = [
        header,
        f"  parameters trained: {plan.params / 1e9:.2f}B; tokens per step: {tokens:,}; "
        f"compiled in {plan.compile_s:.0f} s on {plan.devices} fake CPU devices",
        "  per-device memory (GB; XLA memory_analysis of the step compiled for CPU, which runs bf16",
        "  matmuls in fp32: temporaries are an upper bound for TPU/GPU):",
        f"    parameters (trained)      {kinds.get('params', 0) / GB:8.2f}",
        f"    parameters (frozen ref)   {kinds.get('frozen', 0) / GB:8.2f}",
        f"    optimizer state           {kinds.get('opt', 0) / GB:8.2f}",
        f"    batch                     {kinds.get('batch', 0) / GB:8.2f}",
        f"    = arguments (XLA)         {plan.argument_bytes / GB:8.2f}",
        f"    activations/temp (XLA)    {plan.temp_bytes / GB:8.2f}",
        f"    outputs not donated (XLA) {(plan.output_bytes - plan.alias_bytes) / GB:8.2f}",
        f"    total                     {plan.peak_bytes / GB:8.2f}  of {chip.hbm_gb:g} GB HBM on "
        f"{chip_name}: " + ("fits" if fits else "DOES NOT FIT"),
        "  FLOPs per step (all devices):",
        f"    executed (jaxpr, scans x trip count, remat included) {plan.step_flops:.3e}",
        f"    model (3 x forward per trained model, 1 x frozen)    {plan.model_flops:.3e}",
        f"    analytic 6*N*tokens (+2*N*tokens frozen)             {plan.analytic_flops:.3e}",
        f"    XLA cost_analysis x devices (loop bodies once)       {xla_total:.3e}"
        f"  [jaxpr with loop bodies once: {plan.flops_loops_once:.3e}]",
        f"  on {chip_name} ({chip.peak_tflops:g} TFLOP/s bf16 per chip), compute-bound: step >= "
        f"{plan.step_seconds(chip):.2f} s, MFU <= {100 * plan.mfu(chip):.1f}%",
    ]
    return "\n".join(lines)


def parse_mesh(text: str) -> MeshConfig:
    """'fsdp=64' or 'data=2,fsdp=16,tensor=4' -> MeshConfig (axes not named are 1)."""
    sizes = {"data": 1, "fsdp": 1, "tensor": 1}
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name not in sizes or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--mesh: bad entry {part!r} in {text!r}; expected e.g. data=2,fsdp=16,tensor=4")
        sizes[name] = int(value)
    return MeshConfig(**sizes)


def plan(stage: str, cfg: ModelConfig, optim: OptimConfig, mesh: Mesh, rows: int, seq_len: int) -> Plan:
    """Builds the `stage` step ("sft" | "rpr") abstractly and plans it, traced under `mesh` so the
    model's layout pins (`sharding.constrain_batch`, `gather_weights`) apply."""
    with jax.set_mesh(mesh):
        if stage == "sft":
            spec = sft_step(cfg, optim, mesh, rows, seq_len)
        elif stage == "rpr":  # a reference policy is always planned (kl_coef > 0)
            spec = rpr_step(cfg, optim, mesh, rows, seq_len, PPOConfig(kl_coef=0.05))
        else:
            raise ValueError(f"stage must be sft or rpr, got {stage!r}")
        return plan_step(spec, mesh)


FLAGS = flags.FLAGS
flags.DEFINE_string("model", "qwen3_8_27b", "model preset")
flags.DEFINE_string("mesh", "fsdp=8", "mesh axes, e.g. fsdp=64 or data=2,fsdp=16,tensor=4")
flags.DEFINE_integer("seq_len", 8192, "tokens per row")
flags.DEFINE_integer("batch", 64, "rows per step (global)")
flags.DEFINE_enum("stage", "sft", ["sft", "rpr"], "sft: RSR step; rpr: PPO step with critic and reference")
flags.DEFINE_string("chip", "v5p", f"one of {sorted(CHIPS)}, or give --peak_tflops and --hbm_gb")
flags.DEFINE_float("peak_tflops", None, "bf16 peak per chip (overrides --chip)")
flags.DEFINE_float("hbm_gb", None, "HBM per chip in GB (overrides --chip)")
common.define_config_flags("model_cfg", ModelConfig)
common.define_config_flags("optim", OptimConfig)


def main(argv):
    del argv
    if FLAGS.chip not in CHIPS and (FLAGS.peak_tflops is None or FLAGS.hbm_gb is None):
        raise app.UsageError(f"--chip={FLAGS.chip!r} unknown; choose {sorted(CHIPS)} or set --peak_tflops and --hbm_gb")
    base = CHIPS.get(FLAGS.chip, Chip(0, 0))
    chip = Chip(FLAGS.peak_tflops or base.peak_tflops, FLAGS.hbm_gb or base.hbm_gb)
    cfg = common.model_config_from_flags()
    optim = common.config_from_flags("optim", OptimConfig())
    mesh = sharding_lib.make_mesh(parse_mesh(FLAGS.mesh))
    result = plan(FLAGS.stage, cfg, optim, mesh, FLAGS.batch, FLAGS.seq_len)
    header = (f"plan: model={FLAGS.model} stage={FLAGS.stage} mesh={dict(mesh.shape)} "
              f"batch={FLAGS.batch} x seq_len={FLAGS.seq_len} remat={cfg.remat} scan_layers={cfg.scan_layers}")
    print(format_plan(result, FLAGS.chip, chip, header, FLAGS.batch * FLAGS.seq_len))


if __name__ == "__main__":
    app.run(main)
