"""Bootstrap: give a tiny random base model some ability before the stages run.

A `ScriptedPolicy` replays each training task's oracle (`solution/commands.json`, Terminus
keystrokes) through the common harness in a real sandbox: one turn with every command and
`task_complete`, then the confirmation. The verified episodes are encoded exactly as the
policy will see them at test time, and a brief SFT on their first reply (`first_reply_example`)
produces the pipeline's base policy. Tasks without a `commands.json` are skipped and counted.

`rendered_example` builds the same example without a sandbox (the oracle is not run), so a
bootstrap can cover far more tasks than it verifies, or show a task under another harness (the
`hint` harness, so the base learns to use a hint); `check_rendering` proves on the verified
demonstrations that the rendering is token for token what the sandbox run produced.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from trsi_jax.agent import format_reply, make_harness
from trsi_jax.config import SFTConfig
from trsi_jax.rollout import Budgets, Episode, ScriptedPolicy, encode_chat, run_episodes
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


def first_screen(episode: Episode) -> str:
    """The terminal screen the harness showed beside the task in `episode`'s first message."""
    return episode.messages[1]["content"].rsplit("\n\nTerminal:\n", 1)[1]


def rendered_example(task, harness, screen: str, tokenizer) -> SFTExample:
    """The `first_reply_example` that an oracle episode of `task` under `harness` would give, built
    without a sandbox: the opening the harness shows with `screen`, then the oracle's first reply as
    the scripted policy tokenizes it. Raises ValueError if the task ships no commands.json."""
    commands = oracle_commands(task)
    if commands is None:
        raise ValueError(f"{task.path}: no {COMMANDS_JSON} to render a demonstration from")
    text = format_reply(commands, task_complete=True)
    messages = harness.first_messages(task, screen) + [
        {"role": "assistant", "content": text, "tokens": tokenizer.encode(text) + [tokenizer.im_end_id]}]
    encoded = encode_chat(messages, tokenizer)
    end = encoded.turn_end_positions[0] + 1
    return SFTExample(encoded.tokens_T[:end], encoded.policy_mask_T[:end])


def check_rendering(data: BootstrapData, tasks: Sequence, tokenizer) -> str:
    """Renders every verified demonstration of `data` and checks it equals the sandbox's example;
    returns the first screen to render other tasks with. Raises if any differs."""
    by_id = {t.task_id: t for t in tasks}
    verified = [e for e in data.episodes if e.strict]
    if not verified:
        raise ValueError("no verified demonstration to check the rendering against")
    screen, common = first_screen(verified[0]), make_harness("common")
    for episode, example in zip(verified, data.examples):
        got = rendered_example(by_id[episode.task_id], common, screen, tokenizer)
        if not (np.array_equal(got.tokens, example.tokens) and np.array_equal(got.loss_mask, example.loss_mask)):
            raise ValueError(f"the rendered demonstration of {episode.task_id} differs from its sandbox episode "
                             "(first screen or harness changed?); bootstrap on verified demonstrations only")
    return screen


def train_bootstrap(model, examples: Sequence[SFTExample], tokenizer, sft_cfg: SFTConfig, workdir: str, *,
                    mesh=None, show_progress: bool = True):
    """SFT of `model` in place on `examples`; checkpoints to `workdir/checkpoints` (item "params")."""
    meta = {"model_cfg": dataclasses.asdict(model.cfg), "stage": "bootstrap"}
    return SFTTrainer(model, sft_cfg, workdir, mesh=mesh, pad_id=tokenizer.pad_id, metadata=meta).train(
        examples, progress=show_progress)


def bootstrap(model, tasks: Sequence, tokenizer, sft_cfg: SFTConfig, workdir: str, *, mesh=None,
              backend: str = "local", repeats: int = 1, show_progress: bool = True) -> dict:
    """Trains `model` in place on oracle demonstrations (each repeated `repeats` times in the
    data); checkpoints to `workdir/checkpoints` (item "params"). Returns a summary dict."""
    data = demonstrations(tasks, tokenizer, backend, sft_cfg.max_len, show_progress)
    require_verified(data)
    result = train_bootstrap(model, data.examples * repeats, tokenizer, sft_cfg, workdir, mesh=mesh,
                             show_progress=show_progress)
    return summary(data, len(tasks), len(data.examples) * repeats, result)


def require_verified(data: BootstrapData) -> None:
    if not data.examples:
        failures = sorted({f"{e.task_id}: {e.outcome} ({e.reason})" for e in data.episodes})[:5]
        raise RuntimeError(f"bootstrap: no oracle episode verified; first failures: {failures}")


def summary(data: BootstrapData, tasks: int, sft_examples: int, result) -> dict:
    return {"tasks": tasks, "skipped_without_oracle": data.skipped, "demonstrations": len(data.episodes),
            "verified": data.verified, "sft_examples": sft_examples,
            "sft_steps": result.step, "sft_loss": result.train_loss}
