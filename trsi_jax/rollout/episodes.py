"""Episode runner: policy <-> harness <-> sandbox for many episodes at once.

Each round, every live episode that may still act gets a reply from ONE batched `policy.act`
call; the replies are then applied in a thread pool (sandboxes block on the terminal), new
episodes start in free slots, and finished ones are verified and closed: by default in the
background, overlapping the next rounds' generation (`overlap_verify`). The rounds' batches are
the same either way (an episode frees its slot when its agent phase ends), so a seeded run samples
the same episodes. Every episode is recorded whatever happens, with an `outcome` and a
human-readable `reason`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from trsi_jax.agent.harness import CommonHarness, Session, mark_progress, settle_progress
from trsi_jax.rollout.chat import encode_chat, encode_prompt
from trsi_jax.rollout.policy import Policy, Reply

OUTCOMES = ("success", "failure", "turn_limit", "timeout", "context_overflow", "terminal_lost", "sandbox_error",
            "verifier_error")
# Cut by a budget, not ended by the agent (RPR's `truncation` flag decides how they are valued).
TRUNCATED = ("turn_limit", "timeout", "context_overflow")
# The infrastructure failed, not the policy: the sandbox broke, or the verifier produced no result
# (crash, timeout, zero tests collected, no reward file). Such episodes carry no reward signal:
# they are left out of PPO batches, SFT data and every success rate, and counted on their own.
INFRA_FAILURES = ("sandbox_error", "verifier_error")


def is_infra_failure(episode) -> bool:
    return episode.outcome in INFRA_FAILURES


@dataclasses.dataclass(frozen=True)
class Budgets:
    max_turns: int = 20
    max_tokens: int = 8192  # whole episode (prompt + replies + observations); also caps each reply
    wall_sec: float = 900.0  # agent phase of one episode, generation time included


@dataclasses.dataclass
class Episode:
    """One recorded episode; token arrays cover `messages` (never the optional context)."""

    task_id: str
    family: str
    harness: str
    messages: list[dict]
    tokens: list[int]
    policy_mask: list[int]
    turn_ids: list[int]
    logprobs: list[float]
    turn_end_positions: list[int]
    progress: list[float]  # one per turn when probed (track_progress or a probing harness), else empty
    strict: bool
    partial: float
    outcome: str
    reason: str
    parse_errors: int = 0
    num_turns: int = 0
    wall_sec: float = 0.0
    tests: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Live:
    index: int
    task: object
    context: str | None
    stack: contextlib.ExitStack
    start: float
    session: Session | None = None
    replies: list[Reply] = dataclasses.field(default_factory=list)
    stop: tuple[str, str] | None = None  # (outcome, reason) once the agent phase is over


def _view(session: Session, context: str | None) -> list[dict]:
    """What the policy sees: the recorded messages, plus the context right after the task."""
    if not context:
        return session.messages
    return session.messages[:2] + [{"role": "user", "content": context}] + session.messages[2:]


def _record(live: _Live, harness_name: str, tok, strict: bool, partial: float, tests: dict) -> Episode:
    s = live.session
    messages = s.messages if s else []
    enc = encode_chat(messages, tok)
    logprobs_T = np.zeros(len(enc.tokens_T), np.float32)
    for k, reply in enumerate(live.replies):
        if reply.logprobs is not None:
            where = np.flatnonzero((enc.turn_ids_T == k) & (enc.policy_mask_T == 1))
            logprobs_T[where] = reply.logprobs[enc.reply_starts[k]:]  # the ids the rendering kept
    outcome, reason = live.stop
    if outcome in INFRA_FAILURES:
        strict, partial = False, 0.0
    elif strict:
        outcome = "success"
    task = live.task
    return Episode(
        task_id=task.task_id, family=task.family, harness=harness_name,
        messages=[{"role": m["role"], "content": m["content"]} for m in messages],
        tokens=enc.tokens_T.tolist(), policy_mask=enc.policy_mask_T.tolist(), turn_ids=enc.turn_ids_T.tolist(),
        logprobs=logprobs_T.tolist(), turn_end_positions=list(enc.turn_end_positions),
        progress=list(s.progress) if s else [], strict=bool(strict), partial=float(partial), outcome=outcome,
        reason=reason, parse_errors=s.parse_errors if s else 0, num_turns=s.turns if s else 0,
        wall_sec=time.monotonic() - live.start, tests=dict(tests))


def _error_stop(e: Exception, outcome: str = "sandbox_error") -> tuple[str, str]:
    from trsi_jax.sandbox import SandboxError

    if isinstance(e, SandboxError):
        return "sandbox_error", f"SandboxError: {e}"
    return outcome, f"{type(e).__name__}: {e}"


def verifier_error(result) -> str | None:
    """Why `verify` produced no result (`VerifyResult.error`), else None."""
    return getattr(result, "error", None)


def run_episodes(policy: Policy, tasks: Sequence, harness: CommonHarness, backend: str = "local",
                 budgets: Budgets = Budgets(), context: Sequence[str | None] | None = None,
                 track_progress: bool = False, concurrency: int = 8, show_progress: bool = True,
                 desc: str | None = None, overlap_verify: bool = True) -> list[Episode]:
    """Runs one episode per entry of `tasks` (repeat a task for several samples); results in order.

    context: optional text per task (e.g. an RSR runbook) shown to the policy after the task
      message but absent from the recorded messages and tokens.
    track_progress: progress after every turn (`Episode.progress`, for FDR), measured lazily: a
      turn's state is probed before the next keystrokes change it, the final state is read from
      the verifier's run (`progress_from`; unmeasured, None, when it did not report every progress test).
    desc: the progress bar's label (default "episodes[<harness>]").
    overlap_verify: verify and close finished episodes in their own threads while the next rounds
      generate (up to 2 x `concurrency` sandboxes exist at once); False verifies between rounds.
    """
    from trsi_jax.sandbox import SandboxError, make_sandbox, progress_from, verify

    if context is not None and len(context) != len(tasks):
        raise ValueError(f"context has {len(context)} entries but there are {len(tasks)} tasks")
    tok = policy.tokenizer
    pending = deque(range(len(tasks)))
    live: list[_Live] = []
    results: list[Episode | None] = [None] * len(tasks)

    def start(i: int) -> _Live:
        lv = _Live(i, tasks[i], context[i] if context is not None else None, contextlib.ExitStack(), time.monotonic())
        try:
            sandbox = lv.stack.enter_context(make_sandbox(lv.task, backend=backend))
            lv.session = harness.start(lv.task, sandbox, budgets.max_turns)
        except Exception as e:  # recorded, never raised: one broken sandbox must not stop a run
            lv.stop = _error_stop(e)
        return lv

    def step(lv: _Live, reply: Reply) -> None:
        s = lv.session
        lv.replies.append(reply)
        s.messages.append({"role": "assistant", "content": reply.text, "tokens": reply.tokens})
        try:
            obs = harness.step(s, reply.text, budgets.wall_sec - (time.monotonic() - lv.start))
            if track_progress or s.progress:  # a probing harness also gets one value per turn
                mark_progress(s)
        except SandboxError as e:
            # The agent can kill or garble its own terminal; that ends its turn-taking but is no
            # infrastructure failure (else a failing policy could escape its zero by crashing the
            # terminal). The episode is verified as usual; a sandbox that is really gone fails there.
            lv.stop = ("terminal_lost", f"SandboxError: {e}")
            return
        except Exception as e:
            lv.stop = _error_stop(e)
            return
        if obs is None:
            lv.stop = ("failure", "agent confirmed task completion")
        else:
            s.messages.append({"role": "user", "content": obs})

    def finish(lv: _Live) -> Episode:
        strict, partial, tests = False, 0.0, {}
        try:
            if lv.stop[0] not in INFRA_FAILURES:
                try:
                    result = verify(lv.session.sandbox, lv.task)
                    strict, partial, tests = result.strict, result.partial, result.tests
                    settle_progress(lv.session, progress_from(result, lv.task), probe=False)
                    if verifier_error(result):
                        lv.stop = ("verifier_error", verifier_error(result))
                except Exception as e:
                    lv.stop = _error_stop(e, "verifier_error")
        finally:
            if lv.session is not None:  # no verifier result: the final state stays unmeasured
                settle_progress(lv.session, None, probe=False)
            try:
                lv.stack.close()
            except Exception as e:
                if lv.stop[0] not in INFRA_FAILURES:
                    lv.stop = _error_stop(e)
        return _record(lv, harness.name, tok, strict, partial, tests)

    def record(lv: _Live, ep: Episode) -> None:
        results[lv.index] = ep
        bar.update(1)

    finishing: list[tuple[_Live, Future]] = []
    with ThreadPoolExecutor(max(1, concurrency)) as pool, ThreadPoolExecutor(max(1, concurrency)) as verifiers, \
            tqdm(total=len(tasks), desc=desc or f"episodes[{harness.name}]", disable=not show_progress) as bar:
        while pending or live:
            fresh = [pending.popleft() for _ in range(min(len(pending), concurrency - len(live)))]
            live.extend(pool.map(start, fresh))

            asking, prompts_len = [], []
            for lv in live:
                if lv.stop is not None:
                    continue
                s = lv.session
                if s.turns >= s.max_turns:
                    lv.stop = ("turn_limit", f"turn limit of {s.max_turns} reached")
                elif time.monotonic() - lv.start >= budgets.wall_sec:
                    lv.stop = ("timeout", f"wall-clock budget of {budgets.wall_sec:.0f}s spent")
                else:
                    n = len(encode_prompt(_view(s, lv.context), tok))
                    if n >= budgets.max_tokens:
                        lv.stop = ("context_overflow", f"prompt of {n} tokens reached max_tokens={budgets.max_tokens}")
                    else:
                        asking.append(lv)
                        prompts_len.append(n)
            if asking:
                replies = policy.act([_view(lv.session, lv.context) for lv in asking],
                                     [budgets.max_tokens - n for n in prompts_len])
                list(pool.map(step, asking, replies))

            done = [lv for lv in live if lv.stop is not None]
            live = [lv for lv in live if lv.stop is None]
            if overlap_verify:
                finishing.extend((lv, verifiers.submit(finish, lv)) for lv in done)
                ready = [f[1].done() for f in finishing]  # read once: a future may finish meanwhile
                for (lv, fut), r in zip(finishing, ready):
                    if r:
                        record(lv, fut.result())
                finishing = [f for f, r in zip(finishing, ready) if not r]
            else:
                for ep, lv in zip(pool.map(finish, done), done):
                    record(lv, ep)
        for lv, fut in finishing:
            record(lv, fut.result())
    return results
