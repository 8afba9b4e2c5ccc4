import dataclasses

import pytest

from trsi_jax import config as C


def test_presets_have_exact_27b_dims():
    m = C.model_preset("qwen3_8_27b")
    assert (m.hidden_size, m.num_layers, m.vocab_size, m.intermediate_size) == (5120, 64, 248320, 17408)
    assert (m.num_heads, m.num_kv_heads, m.head_dim) == (24, 4, 256)
    assert (m.linear_num_key_heads, m.linear_num_value_heads) == (16, 48)
    assert m.layer_types[:4] == ("linear", "linear", "linear", "full")
    assert m.layer_types.count("full") == 16


def test_override_parses_by_field_type():
    m = C.override(C.model_preset("tiny"), {"hidden_size": "128", "rope_theta": "1e6",
                                              "scan_layers": "false", "remat": "dots"})
    assert (m.hidden_size, m.rope_theta, m.scan_layers, m.remat) == (128, 1e6, False, "dots")


def test_override_nested_and_errors():
    @dataclasses.dataclass(frozen=True)
    class Stage:
        optim: C.OptimConfig = C.OptimConfig()
        steps: int = 3

    s = C.override(Stage(), {"optim.lr": "3e-6", "steps": "1e2"})
    assert s.optim.lr == 3e-6 and s.steps == 100
    with pytest.raises(ValueError, match="no field 'lrr'"):
        C.override(Stage(), {"lrr": "1"})
    with pytest.raises(ValueError, match="cannot parse 'abc' as int"):
        C.override(Stage(), {"steps": "abc"})
    with pytest.raises(ValueError, match="unknown model preset"):
        C.model_preset("gpt5")


def test_invalid_model_config_is_rejected():
    with pytest.raises(ValueError, match="full_attention_interval"):
        C.override(C.model_preset("tiny"), {"num_layers": "6"})
