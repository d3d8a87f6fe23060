"""verify --model-config: the user's architecture, shrunk and random, on the user's pack."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main

pytest.importorskip("torch")
pytest.importorskip("transformers")

from packshard.torch.layers.matrix import FAMILIES, family_config


def _verify(out, config, tmp_path):
    report = tmp_path / "report.json"
    args = ["verify", str(out), "--model-config", str(config), "--model-rows", "2",
            "--json", str(report)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    return result, json.loads(report.read_text()) if report.is_file() else None


@pytest.mark.parametrize(
    ("family", "kinds", "withheld"),
    [
        ("qwen3_next", {"linear attention", "full attention", "router"}, "Qwen3NextGatedDeltaNet"),
        ("bamba", {"state space", "full attention"}, "BambaMixer"),
        ("gpt_oss", {"attention with sinks", "router"}, None),
    ],
)
def test_the_model_stage_checks_the_layers_of_the_given_architecture(
    family, kinds, withheld, packed_demo, tmp_path, torch_one_thread
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(family_config(family)))
    result, report = _verify(packed_demo, config, tmp_path)
    assert result.exit_code == 0, result.output
    model = report["checks"]["model"]
    assert set(model["layer_kinds"]) == kinds
    assert model["max_logit_delta"] <= 1e-4 and model["control_detected"]
    assert "layers checked: " in result.output
    if withheld is None:
        assert "boundary_control" not in model
    else:  # the seams withheld from the stateful layers: caught, at that class
        control = model["boundary_control"]
        assert control["layers"] == [withheld] and control["max_logit_delta"] > 1e-3
        assert withheld in control["first"]


def test_an_architecture_transformers_does_not_ship_is_refused(packed_demo, tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "my_private_arch", "auto_map": {"x": "y"}}))
    result, _ = _verify(packed_demo, config, tmp_path)
    assert result.exit_code == 2
    assert "model_type 'my_private_arch' cannot be built by transformers" in result.output


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_of_the_matrix_runs_in_the_model_stage(
    family, packed_demo, tmp_path, torch_one_thread
) -> None:
    from packshard.torch.layers.kinds import STATEFUL
    from packshard.verify.run import VerifyOptions, verify_dataset

    config = tmp_path / "config.json"
    config.write_text(json.dumps(family_config(family)))
    options = VerifyOptions(source=False, model_config=str(config), model_rows=1,
                            model_max_tokens=256)  # fmt: skip
    report = verify_dataset(packed_demo, options)
    model = report.checks["model"]
    assert model["status"] == "passed", report.findings.items[:3]
    assert model["control_detected"] and model["max_logit_delta"] <= 1e-4
    if any(kind in model["layer_kinds"] for kind in STATEFUL):
        assert model["boundary_control"]["max_logit_delta"] > 1e-3 * 0.1
