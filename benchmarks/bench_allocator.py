"""The demo's PPO update under glibc malloc vs tcmalloc (`LD_PRELOAD`), side by side.

    JAX_PLATFORMS=cpu .venv/bin/python -m benchmarks.bench_allocator [--runs 2] [--repeats 3]

XLA on CPU allocates and frees its large temporaries (logits, activations, gradients: tens of MB)
on every call. glibc serves blocks above 32 MB with mmap and gives them back on free, so every call
faults its pages in again (13M minor faults and a fifth of the CPU time as system time in two demo
RPR updates); tcmalloc keeps freed memory for reuse. Each run is a fresh child process doing the
workload of `bench_ppo_update` (one demo RPR update: score + one PPO epoch over 64 rows, every
shape compiled first, best of --repeats); children alternate between the two allocators. Prints
each child's best update time, minor page faults and system CPU seconds, the load average, and
`PPO update ratio (glibc / tcmalloc): N.NNx`.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

from benchmarks import bench_ppo_update as ppo_bench

ROOT = os.path.join(os.path.dirname(__file__), "..")


def child(repeats: int) -> None:
    import numpy as np

    from experiments.export import checkpoint_model_config
    from trsi_jax.models import Critic
    from trsi_jax.rpr.handoff import load_policy
    from trsi_jax.sharding import make_mesh
    from trsi_jax.train import ppo as ppo_lib

    demo = ppo_bench.pipeline_preset("demo")
    cfg = demo.rpr1
    mesh = make_mesh(demo.mesh)
    policy, _ = load_policy(ppo_bench.BASE, checkpoint_model_config(ppo_bench.BASE), mesh)
    batches = [ppo_bench._batch(cfg.tasks_per_update * cfg.samples_per_task, demo.max_len, 0.1,
                                policy.cfg.vocab_size, s) for s in range(repeats)]
    learner = ppo_lib.PPOLearner(policy, Critic.from_policy(policy), cfg.ppo, cfg.policy_optim, cfg.critic_optim,
                                 mesh, temperature=cfg.temperature)
    for b in batches:  # compile every shape
        ppo_bench._update(learner, b, 0)
    before = resource.getrusage(resource.RUSAGE_SELF)
    best = min(ppo_bench._update(learner, b, r) for r, b in enumerate(batches))
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(f"RESULT {best:.3f} {after.ru_minflt - before.ru_minflt} {after.ru_stime - before.ru_stime:.2f} "
          f"{int(np.mean([b['mask'].sum() for b in batches]))}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2, help="child processes per allocator (alternating)")
    p.add_argument("--repeats", type=int, default=3, help="timed updates per child (best is kept)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.repeats)
    tcmalloc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "tcmalloc_path.sh")], capture_output=True,
                              text=True).stdout.strip()
    if not tcmalloc:
        sys.exit("libtcmalloc_minimal.so.4 not found: apt-get install libtcmalloc-minimal4 "
                 "(scripts/setup_system.sh installs it as root)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    best = {}
    for run in range(args.runs):
        for name, extra in (("glibc", {}), ("tcmalloc", {"LD_PRELOAD": tcmalloc})):
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_allocator", "--child",
                                  f"--repeats={args.repeats}"], cwd=ROOT, env={**env, **extra},
                                 capture_output=True, text=True)
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode or line is None:
                sys.exit(f"{name} child failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            sec, faults, sys_sec, tokens = line.split()[1:]
            best[name] = min(best.get(name, float("inf")), float(sec))
            print(f"run {run} {name:8s}: best update {float(sec):6.2f} s, {int(faults):>10,} minor faults, "
                  f"{float(sys_sec):5.1f} s system CPU over {args.repeats} updates ({tokens} real tokens each; "
                  f"child {time.perf_counter() - start:.0f} s; load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())})", flush=True)
    print(f"PPO update ratio (glibc / tcmalloc): {best['glibc'] / best['tcmalloc']:.2f}x")


if __name__ == "__main__":
    main()
