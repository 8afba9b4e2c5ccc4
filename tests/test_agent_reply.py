"""Terminus JSON reply parsing: valid, invalid JSON, missing fields, wrong types, text around the JSON."""
import json

import pytest

from trsi_jax.agent.reply import Command, ReplyError, format_reply, parse_reply

VALID = {"analysis": "empty", "plan": "list", "commands": [{"keystrokes": "ls\n", "duration": 0.5},
                                                          {"keystrokes": "C-c"}], "task_complete": False}


def test_valid_reply():
    r = parse_reply(json.dumps(VALID))
    assert r.analysis == "empty" and r.plan == "list" and not r.task_complete and r.warnings == ()
    assert r.commands == (Command("ls\n", 0.5), Command("C-c", 1.0))


def test_task_complete_defaults_false_and_empty_commands_allowed():
    r = parse_reply('{"analysis": "", "plan": "", "commands": []}')
    assert r.commands == () and r.task_complete is False
    assert parse_reply('{"analysis": "", "plan": "", "commands": [], "task_complete": true}').task_complete


def test_extra_text_around_json_is_tolerated_with_warning():
    text = "Sure! Here is my reply:\n```json\n" + json.dumps(VALID) + "\n```\nthanks"
    r = parse_reply(text)
    assert r.commands[0].keystrokes == "ls\n"
    assert r.warnings == ("extra text outside the JSON object was ignored",)
    # a brace in the leading prose does not derail the search
    assert parse_reply("I {think} " + json.dumps(VALID)).plan == "list"


@pytest.mark.parametrize("text, message", [
    ("no json here", "no JSON object found"),
    ('{"analysis": "x", "plan": "y", "commands": [}', "invalid JSON"),
    ('{"analysis": "x", "commands": []}', "missing required field(s): plan"),
    ('{"task_complete": true}', "missing required field(s): analysis, plan, commands"),
    ('{"analysis": 1, "plan": "", "commands": []}', "'analysis' must be a string"),
    ('{"analysis": "", "plan": "", "commands": "ls"}', "'commands' must be a list"),
    ('{"analysis": "", "plan": "", "commands": [{"duration": 1}]}', "commands[0] must be an object"),
    ('{"analysis": "", "plan": "", "commands": [{"keystrokes": "ls", "duration": -1}]}', "non-negative"),
    ('{"analysis": "", "plan": "", "commands": [{"keystrokes": "ls", "duration": "5"}]}', "non-negative"),
    ('{"analysis": "", "plan": "", "commands": [], "task_complete": "yes"}', "true or false"),
])
def test_bad_replies_raise_reply_error(text, message):
    with pytest.raises(ReplyError) as e:
        parse_reply(text)
    assert message in str(e.value)


def test_unknown_fields_warn_and_format_roundtrip():
    r = parse_reply('{"analysis": "", "plan": "", "commands": [], "mood": "good"}')
    assert r.warnings == ("unknown field(s) ignored: mood",)
    text = format_reply(["ls\n", ("sleep 2\n", 3.0)], task_complete=True, analysis="a", plan="p")
    r = parse_reply(text)
    assert r.commands == (Command("ls\n", 1.0), Command("sleep 2\n", 3.0)) and r.task_complete and r.analysis == "a"
