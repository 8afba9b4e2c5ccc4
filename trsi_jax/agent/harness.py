"""The common Terminus-style harness: one episode's conversation with a terminal.

The episode runner owns the loop across many episodes; a harness owns one episode's rules:
the prompt, how a reply becomes keystrokes, what the model observes, and when the episode
ends. Privileged harnesses (`privileged.py`) override the two hooks `after_turn` and
`on_complete`, and `task_message`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from trsi_jax.agent.reply import ReplyError, parse_reply

SYSTEM_PROMPT = """\
You operate a Linux terminal to solve a task. Reply with one JSON object and nothing else:
{"analysis": "what you see", "plan": "what you do next", "commands": [{"keystrokes": "ls -la\\n", "duration": 1}], "task_complete": false}
keystrokes are typed as-is (end a command with \\n); duration is seconds to wait for output.
When the task is done, set task_complete to true; you will be asked to confirm."""

CONFIRM = ("You set task_complete. If the task is really done, reply again with task_complete true "
           "(commands may be empty); otherwise keep working.")


@dataclasses.dataclass
class Session:
    """Mutable per-episode state the harness and the runner share."""

    task: Any
    sandbox: Any
    terminal: Any
    messages: list[dict]  # the recorded conversation (no context); assistant messages carry "tokens"
    max_turns: int
    turns: int = 0
    parse_errors: int = 0
    pending_complete: bool = False
    progress: list[float | None] = dataclasses.field(default_factory=list)  # per turn when probed (None: unmeasured)
    retries: int = 0
    ran_commands: bool = False  # whether the latest turn sent any keystrokes
    unprobed: bool = True  # keystrokes were sent since progress was last measured (or never measured)
    due: int = 0  # turns after `progress` whose value awaits a measure of the current state


def mark_progress(session: Session) -> None:
    """After a turn: give every turn so far a progress value. A turn that left the state as the last
    measure saw it reuses that value; otherwise it joins `due`, measured lazily (`settle_progress`):
    before the next keystrokes change the state, or at the end from the verifier's run. Lazy
    measuring saves the probe of an episode's final state, which the verifier measures anyway."""
    new = session.turns - len(session.progress) - session.due
    if new <= 0:
        return
    if session.unprobed or not session.progress:
        session.due += new
    else:
        session.progress.extend([session.progress[-1]] * new)


def settle_progress(session: Session, value: float | None = None, *, probe: bool = True) -> None:
    """Measure the current state for the `due` turns: with `probe_progress` (a failed probe is
    recorded as None, unmeasured, and never ends the episode), or, with probe=False, as `value`."""
    from trsi_jax.sandbox import SandboxError, probe_progress

    if not session.due:
        return
    if probe:
        try:
            value = probe_progress(session.sandbox, session.task)
        except SandboxError:
            value = None
    session.progress.extend([None if value is None else float(value)] * session.due)
    session.due, session.unprobed = 0, False


def record_progress(session: Session) -> float | None:
    """Progress after the current turn, measured now (probed at most once per state: reused when no
    keystrokes were sent since the last measure). None when it could not be measured."""
    mark_progress(session)
    settle_progress(session)
    return session.progress[-1]


class CommonHarness:
    """What the model faces at test time: Terminus JSON, terminal output, confirmed completion."""

    name = "common"

    def __init__(self, max_output_bytes: int = 4000, max_duration_sec: float = 30.0):
        self.max_output_bytes = max_output_bytes
        self.max_duration_sec = max_duration_sec

    # -- prompt -----------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def task_message(self, task) -> str:
        return f"Task:\n{task.instruction.strip()}"

    def first_messages(self, task, screen: str) -> list[dict]:
        """The conversation's opening: the system prompt, then the task and the first screen."""
        first = self.task_message(task) + f"\n\nTerminal:\n{screen[-self.max_output_bytes:]}"
        return [{"role": "system", "content": self.system_prompt()}, {"role": "user", "content": first}]

    def start(self, task, sandbox, max_turns: int) -> Session:
        terminal = sandbox.terminal()
        return Session(task, sandbox, terminal, self.first_messages(task, terminal.screen()), max_turns)

    # -- one turn ----------------------------------------------------------------------------
    def step(self, session: Session, reply_text: str, time_left_sec: float) -> str | None:
        """Acts on one reply; returns the next observation, or None when the agent is done."""
        session.turns += 1
        session.ran_commands = False
        try:
            reply = parse_reply(reply_text)
        except ReplyError as e:
            session.parse_errors += 1
            session.pending_complete = False
            return (f"Your reply could not be used: {e}. Reply with one JSON object with the fields "
                    "analysis, plan, commands, task_complete.")
        self._run(session, reply.commands, time_left_sec)
        output = session.terminal.read_new_output(self.max_output_bytes) if session.ran_commands else ""
        parts = [f"Warning: {w}." for w in reply.warnings]
        parts.append(f"New terminal output:\n{output}" if output else "No new terminal output.")
        if reply.task_complete:
            if session.pending_complete:
                retry = self.on_complete(session)
                if retry is None:
                    return None
                session.pending_complete = False
                return "\n".join(parts + [retry])
            session.pending_complete = True
            parts.append(CONFIRM)
        else:
            session.pending_complete = False
        extra = self.after_turn(session)
        if extra:
            parts.append(extra)
        return "\n".join(parts)

    def _run(self, session: Session, commands, time_left_sec: float) -> None:
        if commands:  # the last turn's state is measured before these keystrokes change it
            settle_progress(session)
        for c in commands:
            wait = max(0.0, min(c.duration, self.max_duration_sec, time_left_sec))
            session.terminal.send_keys(c.keystrokes, wait)
            session.ran_commands = session.unprobed = True
            time_left_sec -= wait

    # -- hooks for privileged harnesses ------------------------------------------------------
    def after_turn(self, session: Session) -> str:
        """Extra observation text after a turn ('' for none)."""
        return ""

    def on_complete(self, session: Session) -> str | None:
        """Called when the agent confirms completion: None ends the episode, text continues it."""
        return None
