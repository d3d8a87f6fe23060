"""The environment a pack records, and the drift verify names against it."""

from __future__ import annotations

import platform
from importlib.metadata import version

from packshard import __version__
from packshard.format.environment import (
    CONTENT_LIBRARIES,
    Drift,
    environment_drift,
    installed_version,
    likely_cause,
    pack_environment,
    running_environment,
)

CONVENTIONS = {"id": "hf-chat-template/1", "rules": ["a rule"]}


def manifest_of(env: dict) -> dict:
    return {"packshard_version": __version__, "environment": env}


def test_pack_environment_lists_python_the_content_libraries_and_the_conventions():
    env = pack_environment(CONVENTIONS)
    assert env == {
        "python": platform.python_version(),
        "libraries": {name: version(name) for name in CONTENT_LIBRARIES},
        "template_conventions": CONVENTIONS,
    }
    names = ["tokenizers", "jinja2", "markupsafe", "pyarrow", "numpy", "numba"]
    assert list(env["libraries"]) == names


def test_running_environment_adds_packshard_and_the_model_stage_libraries():
    env = running_environment(CONVENTIONS)
    assert env["packshard"] == __version__
    assert env["libraries"]["torch"] == version("torch")
    assert env["libraries"]["transformers"] == version("transformers")
    assert {k: env["libraries"][k] for k in CONTENT_LIBRARIES} == pack_environment(CONVENTIONS)[
        "libraries"
    ]


def test_a_library_that_is_not_installed_has_no_version():
    assert installed_version("packshard-no-such-library") is None


def test_the_same_environment_has_no_drift():
    running = running_environment(CONVENTIONS)
    assert environment_drift(manifest_of(pack_environment(CONVENTIONS)), running) == ()


def test_a_manifest_without_an_environment_names_no_drift():
    assert environment_drift({"packshard_version": "0.0.1"}, running_environment(CONVENTIONS)) == ()


def test_each_difference_is_one_drift_in_order_of_likely_cause():
    running = running_environment(CONVENTIONS)
    recorded = pack_environment(CONVENTIONS)
    recorded["python"] = "3.10.0"
    recorded["libraries"]["numpy"] = "1.26.0"
    recorded["libraries"]["tokenizers"] = "0.20.0"
    recorded["libraries"]["a-library-not-installed"] = "0.2.0"  # recorded by another packshard
    recorded["template_conventions"] = {"id": "hf-chat-template/0", "rules": []}
    manifest = {"packshard_version": "0.0.9", "environment": recorded}
    drift = environment_drift(manifest, running)
    assert [str(d) for d in drift] == [
        f"tokenizers 0.20.0 when packed, {version('tokenizers')} now",
        f"numpy 1.26.0 when packed, {version('numpy')} now",
        "a-library-not-installed 0.2.0 when packed, absent now",
        "template conventions hf-chat-template/0 when packed, hf-chat-template/1 now",
        f"packshard 0.0.9 when packed, {__version__} now",
        f"python 3.10.0 when packed, {platform.python_version()} now",
    ]
    assert drift[0].to_dict() == {
        "name": "tokenizers",
        "recorded": "0.20.0",
        "running": version("tokenizers"),
    }


def test_a_library_the_manifest_does_not_list_is_not_drift():
    recorded = pack_environment(CONVENTIONS)
    del recorded["libraries"]["numba"]
    assert environment_drift(manifest_of(recorded), running_environment(CONVENTIONS)) == ()


def test_likely_cause_names_every_drifted_item():
    assert likely_cause(()) == ""
    drift = (Drift("tokenizers", "0.20.0", "0.23.3"), Drift("jinja2", "3.1.4", None))
    assert likely_cause(drift) == (
        " (likely cause: tokenizers 0.20.0 when packed, 0.23.3 now; "
        "jinja2 3.1.4 when packed, absent now)"
    )
