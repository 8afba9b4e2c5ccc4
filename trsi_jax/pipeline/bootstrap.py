"""Bootstrap: give a tiny random base model some ability before the stages run.

A `ScriptedPolicy` replays each training task's oracle (`solution/commands.json`, Terminus
keystrokes) through the common harness in a real sandbox: one turn with every command and
`task_complete`, then the confirmation. The verified episodes are encoded exactly as the
policy will see them at test time, and a brief SFT on their first reply (`first_reply_example`)
produces the pipeline's base policy. Tasks without a `commands.json` are skipped and counted.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

from trsi_jax.agent import format_reply, make_harness
from trsi_jax.config import SFTConfig
from trsi_jax.rollout import Budgets, Episode, ScriptedPolicy, run_episodes
from trsi_jax.train.data import SFTExample
from trsi_jax.train.sft import SFTTrainer

COMMANDS_JSON = os.path.join("solution", "commands.json")


def oracle_commands(task) -> list[tuple[str, float]] | None:
    """The task's oracle as (keystrokes, duration) pairs, or None if it ships no commands.json."""
    path = os.path.join(task.path, COMMANDS_JSON)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        items = json.load(f)
    try:
        return [(str(c["keystrokes"]), float(c.get("duration", 1.0))) for c in items]
    except (TypeError, KeyError) as e:
        raise ValueError(f"{path}: expected a list of {{keystrokes, duration}} objects ({e})") from None


def oracle_policy(tasks: Sequence, tokenizer) -> ScriptedPolicy:
    """Replies with the oracle of the task named in the conversation's first user message."""
    harness = make_harness("common")
    scripts = {}
    for task in tasks:
        commands = oracle_commands(task)
        if commands is not None:
            scripts[harness.task_message(task)] = commands

    def reply(conversation: list[dict]) -> str:
        first = conversation[1]["content"]
        commands = next((c for prefix, c in scripts.items() if first.startswith(prefix)), None)
        if commands is None:
            raise KeyError(f"no oracle for the task in: {first[:200]!r}")
        turn = sum(m["role"] == "assistant" for m in conversation)
        return format_reply(commands if turn == 0 else [], task_complete=True)

    return ScriptedPolicy(reply, tokenizer)


@dataclasses.dataclass
class BootstrapData:
    examples: list[SFTExample]
    episodes: list[Episode]
    skipped: int  # tasks without an oracle script

    @property
    def verified(self) -> int:
        return sum(e.strict for e in self.episodes)


def demonstrations(tasks: Sequence, tokenizer, backend: str = "local", max_len: int = 4096,
                   show_progress: bool = True) -> BootstrapData:
    """Oracle episodes of `tasks`; the verified ones become SFT examples (loss on the policy mask)."""
    with_oracle = [t for t in tasks if oracle_commands(t) is not None]
    if not with_oracle:
        raise ValueError(f"none of the {len(tasks)} tasks has {COMMANDS_JSON}; cannot bootstrap")
    episodes = run_episodes(oracle_policy(with_oracle, tokenizer), with_oracle, make_harness("common"),
                            backend=backend, budgets=Budgets(max_turns=4, max_tokens=max_len),
                            show_progress=show_progress)
    examples = [first_reply_example(e) for e in episodes if e.strict]
    return BootstrapData(examples, episodes, len(tasks) - len(with_oracle))


def first_reply_example(episode: Episode) -> SFTExample:
    """The episode up to the end of its first reply, loss on that reply only.

    Every demonstration ends with the same empty confirmation reply, so training on it makes
    that reply the most frequent target in the data and an undertrained model answers the task
    with it (no commands). Cutting the demonstration after the first reply teaches only what
    varies: the commands for the task. The episode is still verified whole, and an episode cut
    at the turn limit is verified too, so the confirmation is not needed to succeed."""
    end = episode.turn_end_positions[0] + 1
    return SFTExample(episode.tokens[:end], episode.policy_mask[:end])


def bootstrap(model, tasks: Sequence, tokenizer, sft_cfg: SFTConfig, workdir: str, *, mesh=None,
              backend: str = "local", repeats: int = 1, show_progress: bool = True) -> dict:
    """Trains `model` in place on oracle demonstrations (each repeated `repeats` times in the
    data); checkpoints to `workdir/checkpoints` (item "params"). Returns a summary dict."""
    data = demonstrations(tasks, tokenizer, backend, sft_cfg.max_len, show_progress)
    if not data.examples:
        failures = sorted({f"{e.task_id}: {e.outcome} ({e.reason})" for e in data.episodes})[:5]
        raise RuntimeError(f"bootstrap: no oracle episode verified; first failures: {failures}")
    meta = {"model_cfg": dataclasses.asdict(model.cfg), "stage": "bootstrap"}
    result = SFTTrainer(model, sft_cfg, workdir, mesh=mesh, pad_id=tokenizer.pad_id, metadata=meta).train(
        data.examples * repeats, progress=show_progress)
    return {"tasks": len(tasks), "skipped_without_oracle": data.skipped, "demonstrations": len(data.episodes),
            "verified": data.verified, "sft_examples": len(data.examples) * repeats,
            "sft_steps": result.step, "sft_loss": result.train_loss}
