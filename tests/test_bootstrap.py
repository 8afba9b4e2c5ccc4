"""Bootstrap demonstrations: real oracle episodes, trained on their first reply only, rendered
without a sandbox exactly as the sandbox gives them, and the shipped tiny tokenizer and base that
`make demo` starts from."""
import json
import os

import numpy as np
import pytest

from trsi_jax.agent.harness import CONFIRM
from trsi_jax.config import model_preset
from trsi_jax.agent import make_harness
from trsi_jax.pipeline.bootstrap import check_rendering, demonstrations, rendered_example
from trsi_jax.pipeline.run import built_in_tasks
from trsi_jax.rollout import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "trsi_jax", "assets", "tiny_tokenizer")
BASE = os.path.join(ROOT, "trsi_jax", "assets", "tiny_base")


def test_demonstration_is_cut_after_the_first_reply(tmp_path):
    tok = load_tokenizer(TOKENIZER)
    tasks = built_in_tasks(str(tmp_path / "train"), "train", 1, ["files"])
    data = demonstrations(tasks, tok, show_progress=False)
    assert data.verified == 1 and len(data.examples) == 1
    episode, example = data.episodes[0], data.examples[0]
    # The whole episode ran: commands, confirmation request, the empty confirming reply.
    assert [m["role"] for m in episode.messages].count("assistant") == 2
    assert CONFIRM in episode.messages[3]["content"]
    # The example is the episode's prefix up to the first reply's <|im_end|>, loss on that reply only.
    end = episode.turn_end_positions[0] + 1
    np.testing.assert_array_equal(example.tokens, episode.tokens[:end])
    assert example.tokens[-1] == tok.im_end_id
    np.testing.assert_array_equal(example.loss_mask, episode.policy_mask[:end])
    reply = tok.decode([t for t, m in zip(example.tokens, example.loss_mask) if m])
    assert reply == episode.messages[2]["content"] + "<|im_end|>"
    assert json.loads(episode.messages[2]["content"])["commands"]  # the reply that carries the commands
    assert CONFIRM not in tok.decode(example.tokens)


def test_rendered_demonstrations_equal_the_sandbox_ones_and_show_hints(tmp_path):
    tok = load_tokenizer(TOKENIZER)
    tasks = built_in_tasks(str(tmp_path / "train"), "train", 2, ["files", "text"])
    data = demonstrations(tasks, tok, show_progress=False)
    assert data.verified == 4
    screen = check_rendering(data, tasks, tok)  # token for token, every verified task
    assert screen.startswith("root@") and screen.endswith("#")

    task = tasks[0]
    plain = rendered_example(task, make_harness("common"), screen, tok)
    hinted = rendered_example(task, make_harness("hint"), screen, tok)
    reply = lambda ex: [t for t, m in zip(ex.tokens, ex.loss_mask) if m]
    assert reply(hinted) == reply(plain) and len(hinted.tokens) > len(plain.tokens)
    prompt = tok.decode([t for t, m in zip(hinted.tokens, hinted.loss_mask) if not m])
    assert "Hints:\n- A good first step: " in prompt and "Hints:" not in tok.decode(plain.tokens)

    # A rendering that no longer matches the sandbox (here: another first screen) is refused.
    data.episodes[0].messages[1]["content"] += " "
    with pytest.raises(ValueError, match="differs from its sandbox episode"):
        check_rendering(data, tasks, tok)
    os.remove(os.path.join(task.path, "solution", "commands.json"))
    with pytest.raises(ValueError, match="no solution/commands.json"):
        rendered_example(task, make_harness("common"), screen, tok)


def test_shipped_tokenizer_and_base_fit_the_tiny_preset():
    tok = load_tokenizer(TOKENIZER)
    text = 'cd /app/data && find . -type f -size +500c | sed \'s|^\\./||\' | LC_ALL=C sort > /app/result.txt\n'
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) * 2 < len(text.encode())  # subwords: well under half the bytes
    assert tok.vocab_size <= model_preset("tiny").vocab_size
    with open(os.path.join(BASE, "config.json")) as f:
        cfg = json.load(f)
    tiny = model_preset("tiny")
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"]) == (
        tiny.vocab_size, tiny.hidden_size, tiny.num_layers)
    with open(os.path.join(BASE, "tokenizer.json")) as a, open(os.path.join(TOKENIZER, "tokenizer.json")) as b:
        assert a.read() == b.read()
