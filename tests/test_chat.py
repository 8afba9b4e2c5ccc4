"""Chat encoding: exact template text, masks, turn ids, and turn-by-turn == whole-episode."""
import numpy as np
import pytest

from tests.test_tokenizer import train_bpe
from trsi_jax.rollout.chat import encode_chat, encode_prompt, generation_prompt
from trsi_jax.rollout.tokenizer import ByteTokenizer, HFTokenizer

EPISODE = [
    {"role": "system", "content": "You operate a terminal. Reply with JSON."},
    {"role": "user", "content": "Task:\nCount lines in data.csv\n\nTerminal:\nroot@box:/app# "},
    {"role": "assistant", "content": '{"analysis": "", "plan": "wc", "commands": [{"keystrokes": "wc -l data.csv\\n"}]}'},
    {"role": "user", "content": "New terminal output:\n42 data.csv\nroot@box:/app# "},
    {"role": "assistant", "content": '{"analysis": "42 lines", "plan": "done", "commands": [], "task_complete": true}'},
    {"role": "user", "content": "Confirm? ✓ naïve 日本"},
    {"role": "assistant", "content": '  {"task_complete": true}\n'},
]


def template_text(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


@pytest.fixture(params=["byte", "bpe"])
def tok(request, tmp_path):
    return ByteTokenizer() if request.param == "byte" else HFTokenizer(str(train_bpe(tmp_path / "bpe")))


def test_whole_episode_matches_template_and_masks(tok):
    enc = encode_chat(EPISODE, tok)
    assert tok.decode(enc.tokens_T) == template_text(EPISODE)
    assert enc.tokens_T.shape == enc.policy_mask_T.shape == enc.turn_ids_T.shape
    # policy tokens are exactly each assistant content followed by <|im_end|>
    runs = np.split(np.flatnonzero(enc.policy_mask_T), np.flatnonzero(np.diff(np.flatnonzero(enc.policy_mask_T)) > 1) + 1)
    contents = [m["content"] for m in EPISODE if m["role"] == "assistant"]
    assert len(runs) == len(contents)
    for run, content, end in zip(runs, contents, enc.turn_end_positions):
        assert tok.decode(enc.tokens_T[run]) == content + "<|im_end|>"
        assert run[-1] == end and enc.tokens_T[end] == tok.im_end_id
    # turn ids: -1 up to the first assistant header, then k from turn k's header through its observation
    first = len(encode_chat(EPISODE[:2], tok).tokens_T)
    assert (enc.turn_ids_T[:first] == -1).all() and enc.turn_ids_T[first] == 0
    assert (np.diff(enc.turn_ids_T) >= 0).all() and enc.turn_ids_T[-1] == 2
    obs_start = len(encode_chat(EPISODE[:3], tok).tokens_T)
    obs_end = len(encode_chat(EPISODE[:4], tok).tokens_T)
    assert (enc.turn_ids_T[obs_start:obs_end] == 0).all() and (enc.policy_mask_T[obs_start:obs_end] == 0).all()


def test_turn_by_turn_equals_whole(tok):
    """Incremental: prompt for turn k, then the sampled reply appended, must rebuild the whole encoding."""
    whole = encode_chat(EPISODE, tok)
    sampled_msgs, seen = [], []
    for m in EPISODE:
        if m["role"] == "assistant":
            prompt = encode_prompt(sampled_msgs, tok)
            assert whole.tokens_T[:len(prompt)].tolist() == prompt
            reply = tok.encode(m["content"]) + [tok.im_end_id]  # what a sampler would return
            seen = prompt + reply
            assert whole.tokens_T[:len(seen)].tolist() == seen
            m = dict(m, tokens=reply)
        sampled_msgs.append(m)
    incremental = encode_chat(sampled_msgs, tok)
    for a, b in [(incremental.tokens_T, whole.tokens_T), (incremental.policy_mask_T, whole.policy_mask_T),
                 (incremental.turn_ids_T, whole.turn_ids_T)]:
        np.testing.assert_array_equal(a, b)
    assert incremental.turn_end_positions == whole.turn_end_positions


def test_sampled_tokens_are_kept_verbatim_and_cut_off_replies_close_unmasked():
    tok = ByteTokenizer()
    odd = [ord("{"), 0xE6, ord("}")]  # not what encoding the decoded text would give back
    msgs = EPISODE[:2] + [{"role": "assistant", "content": tok.decode(odd), "tokens": odd}]
    enc = encode_chat(msgs, tok)
    head = len(encode_prompt(EPISODE[:2], tok))
    assert enc.tokens_T[head:head + 3].tolist() == odd
    assert enc.policy_mask_T[head:head + 3].tolist() == [1, 1, 1]
    # no <|im_end|> sampled: the template closes the turn with one the policy did not produce
    assert enc.tokens_T[head + 3] == tok.im_end_id and enc.policy_mask_T[head + 3] == 0
    assert enc.turn_end_positions == (head + 2,)


def test_generation_prompt_and_bad_messages():
    tok = ByteTokenizer()
    assert tok.decode(generation_prompt(tok)) == "<|im_start|>assistant\n"
    with pytest.raises(ValueError, match=r"messages\[1\]\['role'\] = 'robot'"):
        encode_chat([EPISODE[0], {"role": "robot", "content": "x"}], tok)
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        encode_chat([{"content": "x"}], tok)
