"""Can a model config learn to copy? Induction on random token sequences, fixed vs variable offset.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_induction.py
    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/bench_induction.py --set full_attention_interval=2 --steps 4000

Trains a fresh model (the `tiny` preset plus `--set field=value` overrides) from scratch with
AdamW on sequences `a filler a` (a: random ids, loss on the second `a` after its first token) and
prints the loss beside the uniform loss log(V). Two settings, each from a fresh init:
- fixed: |a| = 16, no filler. Solvable by attending a fixed distance back (positional copy).
- variable: |a| in {8, 16, 24, 32}, filler in {0, 8, 16, 32}. Needs content-based induction
  (find the earlier occurrence of the current token, copy its successor): what copying a word
  from a task's instruction or a command from a hint needs (issue 14).
A config that learns `fixed` but not `variable` copies by position only.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from trsi_jax.config import model_preset


def _override(cfg, items):
    for item in items:
        key, value = item.split("=", 1)
        if not hasattr(cfg, key):
            raise SystemExit(f"--set {item}: ModelConfig has no field {key!r}")
        cfg = dataclasses.replace(cfg, **{key: type(getattr(cfg, key))(value)})
    return cfg


def run(cfg, variable: bool, steps: int, vocab: int, lr: float, batch: int, seed: int) -> list[float]:
    from trsi_jax.models import Qwen

    model = Qwen(cfg, rngs=nnx.Rngs(seed))
    opt = nnx.Optimizer(model, optax.adamw(lr), wrt=nnx.Param)

    def loss_fn(m, x_BT, n):
        logits = m(x_BT)[:, -n:-1].astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, x_BT[:, -n + 1:]).mean()

    @nnx.jit(static_argnums=(3,))
    def step(m, o, x_BT, n):
        loss, grads = nnx.value_and_grad(loss_fn)(m, x_BT, n)
        o.update(m, grads)
        return loss

    rng, losses = np.random.default_rng(seed), []
    for i in range(steps):
        n, f = (int(rng.choice([8, 16, 24, 32])), int(rng.choice([0, 8, 16, 32]))) if variable else (16, 0)
        a, filler = rng.integers(0, vocab, (batch, n)), rng.integers(0, vocab, (batch, f))
        losses.append(float(step(model, opt, jnp.asarray(np.concatenate([a, filler, a], 1)), n)))
        if (i + 1) % 250 == 0:
            print(f"  {'variable' if variable else 'fixed':8s} step {i + 1:5d}  loss {np.mean(losses[-50:]):.3f}"
                  f"  (uniform {np.log(vocab):.3f})", flush=True)
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], help="ModelConfig override field=value (repeatable)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--vocab", type=int, default=450, help="ids drawn from [0, vocab): ~the tiny BPE ids in use")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--settings", default="fixed,variable", help="which settings to train, comma-separated")
    args = p.parse_args()
    settings = args.settings.split(",")
    if set(settings) - {"fixed", "variable"}:
        raise SystemExit(f"--settings {args.settings!r}: choose from fixed,variable")
    cfg = _override(model_preset("tiny"), args.set)
    if args.vocab > cfg.vocab_size:
        raise SystemExit(f"--vocab {args.vocab} exceeds the model's vocab_size {cfg.vocab_size}")
    print(f"{jax.devices()[0].platform}, load average {os.getloadavg()[0]:.2f}; overrides {args.set or 'none'}")
    result = {}
    for variable in [s == "variable" for s in settings]:
        losses = run(cfg, variable, args.steps, args.vocab, args.lr, args.batch, args.seed)
        result["variable" if variable else "fixed"] = float(np.mean(losses[-50:]))
    uniform = np.log(args.vocab)
    for name, loss in result.items():
        print(f"{name:8s} final loss {loss:.3f} = {loss / uniform:.0%} of uniform: "
              f"{'learned' if loss < 0.5 * uniform else 'NOT learned'}")


if __name__ == "__main__":
    main()
