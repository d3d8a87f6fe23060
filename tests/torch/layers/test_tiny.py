"""tiny: any architecture's config shrunk to a few random layers, its pattern kept."""

from __future__ import annotations

import json

import pytest

from packshard.errors import UsageError
from packshard.torch.layers.tiny import read_config, shrink, tiny_model


def test_the_pattern_is_cut_to_one_of_each_kind_in_order() -> None:
    config = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 48,
        "hidden_size": 2048,
        "num_experts": 512,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    config["layer_types"] = config["layer_types"] * 12
    small = shrink(config, 1000, 4096)
    assert small["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert small["num_hidden_layers"] == 4
    assert (small["hidden_size"], small["num_experts"], small["vocab_size"]) == (64, 4, 1000)
    assert small["use_cache"] is False


def test_a_per_layer_value_list_is_cut_with_the_pattern() -> None:
    config = {"num_hidden_layers": 6, "layer_types": ["a", "b"] * 3, "limits": [1, 2, 3, 4, 5, 6]}
    small = shrink(config, 100, 64)
    assert small["limits"] == [1, 2] and small["num_hidden_layers"] == 2


def test_periods_keep_the_first_attention_layer() -> None:
    config = {"num_hidden_layers": 32, "attn_layer_period": 8, "attn_layer_offset": 4,
              "expert_layer_period": 2, "expert_layer_offset": 1}  # fmt: skip
    assert shrink(config, 100, 64)["num_hidden_layers"] == 5


def test_a_config_file_builds_its_architecture(tmp_path) -> None:
    pytest.importorskip("transformers")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 36}))
    model = tiny_model(path, 300, seed=1)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == 300
    same = tiny_model(tmp_path, 300, seed=1)  # a folder holding config.json
    assert all((a == b).all() for a, b in zip(model.parameters(), same.parameters(), strict=True))


def test_a_vision_language_config_gives_its_text_model() -> None:
    data, _ = read_config({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}})
    assert data["model_type"] == "qwen3_5_text"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"hidden_size": 8}, "no model_type"),
        ({"model_type": "not_an_architecture"}, "cannot be built by transformers"),
    ],
)
def test_an_unknown_architecture_is_refused_by_name(config, message) -> None:
    pytest.importorskip("transformers")
    with pytest.raises(UsageError, match=message):
        tiny_model(config, 100)


def test_an_unreadable_config_names_the_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(UsageError, match=r"config\.json: cannot read the model config"):
        read_config(path)
