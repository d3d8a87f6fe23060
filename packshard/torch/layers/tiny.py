"""Any transformers causal-LM architecture, shrunk to a few layers and randomly initialised.

A seam check needs the user's *architecture* (which layer kinds, in which order, with which
options), not the user's weights: a leak is a property of how a layer mixes tokens, and a
random model shows it as plainly as a trained one (a leaking gated delta net moves logits by
about 5, a Mamba-2 layer by about 4, on the two-to-eight-layer models built here).  So
:func:`tiny_model` takes a ``config.json`` (or a model type), keeps everything that decides
how tokens are mixed, and shrinks what only decides the size::

    config.json (Qwen3-Next 80B)            tiny model (≈0.2M parameters + embeddings)
    hidden 2048, 48 layers                  hidden 64, 4 layers
    layer_types [lin lin lin full] × 12     layer_types [lin lin lin full]   (one period)
    512 experts, 10 per token               4 experts, 2 per token
    linear heads 16 k / 32 v of 128         2 k / 4 v of 16
    vocab 151,936                           the pack's ids, folded into ≤ 4,096

The layer pattern is cut to its shortest prefix that holds every kind of layer at least
once (at least two layers).  Nothing is downloaded, no remote code runs: the architecture
must be one transformers ships (``model_type`` known to ``AutoConfig``).

Where the weights do matter (the reference model of a preference pack, ``verify --model
FOLDER``), :func:`local_causal_lm` loads a local model folder whole, under the same rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packshard.errors import UsageError

TINY_VOCAB = 4096
INIT_RANGE = 0.1
"""The weights' standard deviation, at least: at 0.02 a tiny Zamba's naive-mask leak was 2.5e-3,
under the control's 1e-2 floor; at 0.1 every family's leak stands decades above its noise."""

_SIZES: dict[str, int] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "num_attention_heads": 4,
    "head_dim": 16,
    "attention_head_dim": 32,
    "attention_hidden_size": 128,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 16,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "mamba_chunk_size": 32,
    "mamba_dt_rank": 8,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,
    "mamba_headdim": 32,
    "n_mamba_heads": 4,
    "ssm_state_size": 16,
    "state_size": 16,
    "chunk_size": 32,
    "num_heads": 8,
    "block_size": 32,
    "num_dense_layers": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "num_expert_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "indexer_n_heads": 2,
    "indexer_head_dim": 16,
    "indexer_budget": 32,
    "indexer_compress_ratio": 8,
    "sliding_window": 64,
    "attention_chunk_size": 64,
}
"""Size fields and their tiny values; a field is set only where the config has it."""

_INDEX_LISTS = ("full_attn_idxs", "hybrid_layer_ids", "attn_layer_indices")
_PERIODS = (
    ("attn_layer_period", "attn_layer_offset"),
    ("expert_layer_period", "expert_layer_offset"),
)


def _layer_count(config: dict[str, Any]) -> int:
    """How many layers the tiny model keeps: one of each kind, in the config's own order."""
    layers = int(config.get("num_hidden_layers") or 0)
    patterns = [
        v
        for v in config.values()
        if isinstance(v, list) and v and len(v) == layers and all(isinstance(e, str) for e in v)
    ]
    if patterns:
        joint = list(zip(*patterns, strict=True))
        seen: set[tuple[str, ...]] = set()
        for i, entry in enumerate(joint):
            seen.add(entry)
            if len(seen) == len(set(joint)):
                return max(i + 1, 2)
    text = config.get("hybrid_override_pattern")
    if isinstance(text, str) and text:
        return max(max(text.index(c) for c in set(text)) + 1, 2)
    need = 2
    for key in _INDEX_LISTS:
        if isinstance(config.get(key), list) and config[key]:
            need = max(need, min(config[key]) + 1, 2)
            if len(config[key]) < layers:  # a mix: keep a layer that is not in the list
                gaps = [i for i in range(layers) if i not in set(config[key])]
                need = max(need, gaps[0] + 1)
    for period, offset in _PERIODS:
        if isinstance(config.get(period), int) and isinstance(config.get(offset), int):
            need = max(need, config[offset] + 1)
    return min(need, layers) if layers else need


def shrink(config: dict[str, Any], vocab_size: int, max_positions: int) -> dict[str, Any]:
    """Return ``config`` (a ``config.json`` mapping) with its sizes cut and its pattern kept."""
    out = dict(config)
    layers = int(out.get("num_hidden_layers") or 0)
    keep = _layer_count(out)
    for key, value in list(out.items()):
        if isinstance(value, list) and value and len(value) == layers:
            out[key] = value[:keep]  # a per-layer pattern or per-layer values
    text = out.get("hybrid_override_pattern")
    if isinstance(text, str) and text:
        out["hybrid_override_pattern"] = text[:keep]
    for key in _INDEX_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [i for i in out[key] if i < keep]
    out["num_hidden_layers"] = keep
    for key, value in _SIZES.items():
        if isinstance(out.get(key), int) and not isinstance(out.get(key), bool):
            out[key] = value
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(kv_heads, int):  # grouped queries stay grouped, full heads stay full
        out["num_key_value_heads"] = out["num_attention_heads"] if kv_heads == heads else 2
    for key in (
        "head_dim",
        "n_group",
    ):  # None here means "derive it": derive it from the tiny sizes
        if key in out and out[key] is None:
            out[key] = _SIZES[key] if key in _SIZES else 1
    if isinstance(out.get("mlp_only_layers"), list):
        out["mlp_only_layers"] = []
    if isinstance(out.get("max_window_layers"), int):
        out["max_window_layers"] = keep
    out["vocab_size"] = vocab_size
    for key in ("max_position_embeddings", "n_positions"):
        if key in out:
            out[key] = max(int(out[key] or 0), max_positions)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(out.get(key), int) and out[key] >= vocab_size:
            out[key] = None if key == "pad_token_id" else 0
    out["tie_word_embeddings"] = False
    if isinstance(out.get("initializer_range"), float):  # a random model that shows its leaks
        out["initializer_range"] = max(out["initializer_range"], INIT_RANGE)
    out["use_cache"] = False
    for key in ("quantization_config", "auto_map", "transformers_version", "architectures"):
        out.pop(key, None)
    return out


def read_config(spec: str | Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Return the text model's ``config.json`` mapping and a name for messages.

    A vision-language config's ``text_config`` is taken (its language model is what packs
    of text train).  Raises :class:`~packshard.errors.UsageError` for a missing or unreadable
    file, or one without ``model_type``.
    """
    if isinstance(spec, dict):
        data, name = dict(spec), str(spec.get("model_type", "config"))
    else:
        path = Path(spec)
        target = path / "config.json" if path.is_dir() else path
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"{target}: cannot read the model config ({exc})") from None
        if not isinstance(data, dict):
            raise UsageError(f"{target}: a model config is a JSON object")
        name = str(target)
    if isinstance(data.get("text_config"), dict) and data["text_config"].get("model_type"):
        data = dict(data["text_config"])
    if not isinstance(data.get("model_type"), str):
        raise UsageError(
            f"{name}: no model_type (a transformers config.json names its architecture)"
        )
    return data, name


def tiny_model(
    spec: str | Path | dict[str, Any], vocab_size: int, seed: int = 0, max_positions: int = 8192
) -> Any:
    """Build ``spec``'s architecture shrunk (see the module docstring): float32, eval, CPU.

    The weights depend only on ``seed`` (the global torch generator is left untouched).
    Raises :class:`~packshard.errors.UsageError` naming the config when transformers does not
    ship the architecture or cannot build it as a causal language model.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    data, name = read_config(spec)
    model_type = str(data["model_type"])
    try:  # every field the architecture has, so that each size field is shrunk
        defaults = AutoConfig.for_model(model_type).to_dict()
        layers = defaults.get("num_hidden_layers")
        if data.get("num_hidden_layers", layers) != layers:  # per-layer defaults no longer fit
            defaults = {
                k: v for k, v in defaults.items() if not (isinstance(v, list) and len(v) == layers)
            }
        full = {**defaults, **data}
        small = shrink(full, min(vocab_size, TINY_VOCAB), max_positions)
        small.pop("model_type", None)
        config = AutoConfig.for_model(model_type, **small)
    except Exception as exc:
        raise UsageError(
            f"{name}: model_type {model_type!r} cannot be built by transformers "
            f"{transformers.__version__} ({str(exc).splitlines()[0][:200]}); only architectures "
            "transformers ships are checked, never remote code"
        ) from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception as exc:
            raise UsageError(
                f"{name}: {model_type} has no causal-LM model that builds here "
                f"({str(exc).splitlines()[0][:200]})"
            ) from None
    return model.float().eval()


def local_causal_lm(path: Path) -> Any:
    """Load the causal LM of a checked model folder: float32, offline, no remote code, eval."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path,
        local_files_only=True,
        trust_remote_code=False,
        dtype=torch.float32,
        attn_implementation="sdpa",
    )
    return model.eval()
