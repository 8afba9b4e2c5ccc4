"""Terminus-style JSON replies: parse what the model wrote, or format one (scripted policies).

A reply is one JSON object `{"analysis", "plan", "commands": [{"keystrokes", "duration"}],
"task_complete"}`. Text around the object is tolerated (with a warning), since small models
often add some; anything else raises `ReplyError` whose message is shown back to the model.
"""
from __future__ import annotations

import dataclasses
import json


class ReplyError(ValueError):
    """The reply could not be used; the message says what to fix."""


@dataclasses.dataclass(frozen=True)
class Command:
    keystrokes: str
    duration: float = 1.0


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    analysis: str
    plan: str
    commands: tuple[Command, ...]
    task_complete: bool
    warnings: tuple[str, ...] = ()


def _find_object(text: str) -> tuple[dict, int, int]:
    decoder = json.JSONDecoder()
    start = text.find("{")
    first_error = None
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
            if isinstance(obj, dict):
                return obj, start, end
        except json.JSONDecodeError as e:
            first_error = first_error or e
        start = text.find("{", start + 1)
    if first_error is None:
        raise ReplyError("no JSON object found in the reply")
    raise ReplyError(f"invalid JSON: {first_error.msg} at line {first_error.lineno} column {first_error.colno}")


def parse_reply(text: str) -> ParsedReply:
    obj, start, end = _find_object(text)
    warnings = []
    if text[:start].strip() or text[end:].strip():
        warnings.append("extra text outside the JSON object was ignored")
    missing = [k for k in ("analysis", "plan", "commands") if k not in obj]
    if missing:
        raise ReplyError(f"missing required field(s): {', '.join(missing)}")
    for key in ("analysis", "plan"):
        if not isinstance(obj[key], str):
            raise ReplyError(f"field '{key}' must be a string")
    if not isinstance(obj["commands"], list):
        raise ReplyError("field 'commands' must be a list of {\"keystrokes\", \"duration\"} objects")
    commands = []
    for i, c in enumerate(obj["commands"]):
        if not isinstance(c, dict) or not isinstance(c.get("keystrokes"), str):
            raise ReplyError(f"commands[{i}] must be an object with a string 'keystrokes'")
        duration = c.get("duration", 1.0)
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
            raise ReplyError(f"commands[{i}].duration must be a non-negative number, got {duration!r}")
        commands.append(Command(c["keystrokes"], float(duration)))
    complete = obj.get("task_complete", False)
    if not isinstance(complete, bool):
        raise ReplyError(f"field 'task_complete' must be true or false, got {complete!r}")
    unknown = sorted(set(obj) - {"analysis", "plan", "commands", "task_complete"})
    if unknown:
        warnings.append(f"unknown field(s) ignored: {', '.join(unknown)}")
    return ParsedReply(obj["analysis"], obj["plan"], tuple(commands), complete, tuple(warnings))


def format_reply(commands: list[tuple[str, float]] | list[str], task_complete: bool = False,
                 analysis: str = "", plan: str = "") -> str:
    """A well-formed reply; `commands` as keystroke strings or (keystrokes, duration) pairs."""
    cmds = [{"keystrokes": c, "duration": 1.0} if isinstance(c, str) else {"keystrokes": c[0], "duration": c[1]}
            for c in commands]
    return json.dumps({"analysis": analysis, "plan": plan, "commands": cmds, "task_complete": task_complete})
