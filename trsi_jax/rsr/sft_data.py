"""SFT examples from verified replays, with the runbook and critic dialogue out of the context.

The replay's recorded messages never held the runbook (it was context), and the critic never
spoke to the executor; each example is `encode_chat(messages)` re-encoded from those messages,
loss on the assistant tokens. Before an example is kept it is checked: no runbook header or
runbook prose (milestone descriptions, checks, recovery, pitfalls) in a system or user message,
and no test or solution text (n-gram overlap, verifier paths) in what the assistant wrote. Terminal
output is not scanned: the sandbox holds neither tests nor solution while the agent acts, so an
output equal to a test's expectation is the agent's own correct result. A replay that fails a
check is dropped with the reason, and so is one whose messages repeat an earlier example's (a
deterministic executor replays a runbook identically; copies would only re-weight tasks).
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from trsi_jax.agent import ReplyError, parse_reply
from trsi_jax.rollout import encode_chat
from trsi_jax.rollout.episodes import is_infra_failure
from trsi_jax.rsr.leak_scan import LeakScanner
from trsi_jax.rsr.runbook import HEADER, Runbook
from trsi_jax.train.data import SFTExample

_MIN_PROSE = 20  # shorter runbook strings ("Finish.") are too generic to call a leak
DUPLICATE = "identical to an earlier example"


def contamination(messages: Sequence[dict], runbook: Runbook, scanner: LeakScanner) -> list[str]:
    """Why these messages may not be trained on ([] = clean)."""
    reasons = []
    context = "\n".join(m["content"] for m in messages if m["role"] != "assistant")
    prose = [*runbook.checks, *runbook.recovery, *runbook.pitfalls, *(m.description for m in runbook.milestones)]
    if HEADER in context:
        reasons.append("runbook header in the context")
    for text in prose:
        if len(text) >= _MIN_PROSE and text in context and text not in scanner.public_text:
            reasons.append(f"runbook text in the context: {text[:80]!r}")
    for m in messages:
        if m["role"] == "assistant":
            for text in _reply_fields(m["content"]):
                reasons.extend(f.reason for f in scanner.scan(text) if f.kind != "expected_output")
    return reasons


def _reply_fields(content: str) -> list[str]:
    """The texts of a Terminus reply (analysis, plan, each command), so the JSON keys around them
    do not join a quotation; the raw content when it does not parse."""
    try:
        reply = parse_reply(content)
    except ReplyError:
        return [content]
    return [reply.analysis, reply.plan, *(c.keystrokes for c in reply.commands)]


def build_examples(replays: Sequence[dict], scanners: dict, tokenizer) -> tuple[list[dict], list[dict]]:
    """(examples, dropped) from replay records {"task_id", "runbook", "episode"}; only strict
    successes count. An example is {"task_id", "source_harness", "messages", "tokens", "loss_mask"}."""
    examples, dropped, seen = [], [], set()
    for rec in replays:
        ep = rec["episode"]
        if not ep.strict or is_infra_failure(ep):  # only verified successes of a working sandbox
            continue
        messages = [{"role": m["role"], "content": m["content"]} for m in ep.messages]
        key = json.dumps(messages)
        reasons = [DUPLICATE] if key in seen else contamination(messages, rec["runbook"], scanners[ep.task_id])
        seen.add(key)
        if reasons:
            dropped.append({"task_id": ep.task_id, "reasons": reasons})
            continue
        enc = encode_chat(messages, tokenizer)
        examples.append({"task_id": ep.task_id, "source_harness": rec.get("source_harness", ""),
                         "messages": messages, "tokens": enc.tokens_T.tolist(),
                         "loss_mask": enc.policy_mask_T.tolist()})
    return examples, dropped


def save_examples(examples: Sequence[dict], out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "examples.jsonl"), "w") as f:
        for ex in examples:
            f.write(json.dumps(ex) + "\n")


def load_examples(out_dir: str) -> list[dict]:
    path = os.path.join(out_dir, "examples.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SFT examples at {path}")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def to_sft_examples(examples: Sequence[dict]) -> list[SFTExample]:
    return [SFTExample(ex["tokens"], ex["loss_mask"]) for ex in examples]
