"""Rollout engine throughput: the same episodes run by the earlier engine (every turn re-prefills
the whole conversation, `reuse_cache=False`; finished episodes verified between rounds,
`overlap_verify=False`) and by today's (each episode continues from its kept cache and only new
tokens are prefilled; verification runs while the next rounds generate), side by side in one run,
interleaved, best of --repeats each.

    JAX_PLATFORMS=cpu python -m benchmarks.bench_rollout                    # tiny base, 32 held-out tasks
    JAX_PLATFORMS=cpu python -m benchmarks.bench_rollout --policy scripted  # 8 turns of varied sleeps

`--policy model` samples the shipped tiny base (`trsi_jax/assets/tiny_base`) on built-in held-out
tasks in real local sandboxes at the demo's settings; `--policy scripted` sends, for --turns turns,
commands that sleep 0.1-0.9 s (varied per episode and turn), so only sandboxes and the verifier
take time. Prints episodes/s, generated tokens/s, prompt tokens run through the model per episode
(quadratic in turns when re-prefilled, linear when cached) and the share of wall time inside
`policy.act` (the model) against the rest (sandboxes, verifier, host), with the load average.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from trsi_jax.agent import make_harness
from trsi_jax.agent.reply import format_reply
from trsi_jax.rollout import Budgets, ModelPolicy, SampleConfig, ScriptedPolicy, run_episodes
from trsi_jax.rollout.chat import encode_prompt

BASE = os.path.join(os.path.dirname(__file__), "..", "trsi_jax", "assets", "tiny_base")


class Timed:
    """Wraps a policy: seconds inside `act`, prompt tokens prefilled and tokens generated."""

    def __init__(self, policy):
        self.policy, self.tokenizer = policy, policy.tokenizer
        self.seconds, self.prompt, self.generated = 0.0, 0, 0

    @property
    def prefill(self) -> int:  # what the model ran: all prompt tokens unless it reuses caches
        return getattr(self.policy, "prefilled", self.prompt)

    def act(self, conversations, max_new_tokens=None):
        self.prompt += sum(len(encode_prompt(c, self.tokenizer)) for c in conversations)
        t0 = time.perf_counter()
        replies = self.policy.act(conversations, max_new_tokens)
        self.seconds += time.perf_counter() - t0
        self.generated += sum(len(r.tokens) for r in replies)
        return replies


def scripted(tokenizer, turns: int):
    def fn(conversation):
        k = sum(m["role"] == "assistant" for m in conversation)
        pause = 0.1 + 0.1 * ((len(conversation[1]["content"]) + 3 * k) % 9)  # varied, reproducible
        return format_reply([(f"sleep {pause:.1f}; echo turn {k}\n", pause + 0.1)], task_complete=k + 1 >= turns)
    return ScriptedPolicy(fn, tokenizer)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", choices=("model", "scripted"), default="model")
    p.add_argument("--tasks", type=int, default=32, help="episodes per engine (held-out tasks, files + text)")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    from trsi_jax.models.hf_io import config_from_hf, load_hf
    from trsi_jax.pipeline.config import PipelineConfig
    from trsi_jax.pipeline.run import built_in_tasks
    from trsi_jax.rollout.tokenizer import load_tokenizer

    tok = load_tokenizer(BASE)
    pc = PipelineConfig()
    with tempfile.TemporaryDirectory() as tmp:
        tasks = built_in_tasks(os.path.join(tmp, "heldout"), "heldout", -(-args.tasks // 2),
                               ["files", "text"])[:args.tasks]
        model = load_hf(BASE, config_from_hf(BASE)) if args.policy == "model" else None
        budgets = Budgets(max_turns=args.turns, max_tokens=pc.max_len)
        best = {}
        for r in range(args.repeats):
            for new in (False, True):
                if model is not None:
                    policy = ModelPolicy(model, tok, SampleConfig(temperature=pc.eval_temperature,
                                                                  max_new_tokens=pc.eval_max_new_tokens),
                                         max_len=pc.max_len, seed=r, reuse_cache=new)
                else:
                    policy = scripted(tok, args.turns)
                timed = Timed(policy)
                t0 = time.perf_counter()
                eps = run_episodes(timed, tasks, make_harness("common"), budgets=budgets,
                                   concurrency=args.concurrency, show_progress=False, overlap_verify=new)
                wall = time.perf_counter() - t0
                name = "today's engine" if new else "earlier engine"
                print(f"repeat {r} {name}: {wall:6.1f} s, {len(eps) / wall:5.2f} episodes/s, "
                      f"{timed.generated / wall:7.0f} generated tokens/s, "
                      f"{timed.prefill / len(eps):7.0f} prefill tokens/episode, model {timed.seconds / wall:4.0%} "
                      f"of wall, sandboxes/verifier/host {1 - timed.seconds / wall:4.0%}, "
                      f"strict {sum(e.strict for e in eps) / len(eps):.2f}; load {os.getloadavg()[0]:.2f}", flush=True)
                best[new] = min(best.get(new, wall), wall)
    print(f"{args.policy} policy, {len(tasks)} episodes x up to {args.turns} turns at concurrency "
          f"{args.concurrency}: today's / earlier engine episodes/s: {best[False] / best[True]:.2f}x")


if __name__ == "__main__":
    main()
