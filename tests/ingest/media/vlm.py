"""Shared by the vision tests: the shared multimodal data and transformers' own processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MULTIMODAL_SKIP = "the shared multimodal data (../shared/data/multimodal) is absent"


def multimodal(shared: Path) -> Path:
    """The multimodal folder of the shared data; skip when this checkout has none."""
    folder = shared / "multimodal"
    if not (folder / "mllm_demo.json").is_file():
        pytest.skip(MULTIMODAL_SKIP)
    return folder


def shared_images(folder: Path) -> list[Path]:
    """Every still image of the shared multimodal data."""
    found = [*(folder / "images").iterdir(), *(folder / "mllm_demo_data").glob("*.jpg")]
    found += (folder / "qwen3_vl_finetune_demo" / "demo" / "images").glob("*.png")
    return sorted(p for p in found if p.suffix in (".png", ".jpg"))


def qwen_processor(tokenizer_dir: Path, template: Path, **bounds: Any) -> Any:
    """transformers' Qwen2-VL processor with its PIL image processor, built offline.

    ``Qwen2VLProcessor.__init__`` also builds a video processor, which needs torchvision (not
    installed); the processor's ``__call__`` and ``apply_chat_template`` need only the
    attributes set here, the same ones ``__init__`` sets.
    """
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )
    from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    proc = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    proc.image_processor = Qwen2VLImageProcessorPil(**bounds)
    proc.tokenizer = tok
    proc.video_processor = None
    proc.chat_template = template.read_text()
    proc.image_token, proc.video_token = "<|image_pad|>", "<|video_pad|>"
    proc.image_token_id = tok.convert_tokens_to_ids("<|image_pad|>")
    proc.video_token_id = tok.convert_tokens_to_ids("<|video_pad|>")
    return proc


def pack_images(shared: Path, root: Path, **options: Any) -> Path:
    """Copy LLaMA-Factory's image demo (records and images) under ``root`` and pack it.

    The copy is the test's own (it may change or delete an image); the pack holds the six
    image records and the three video records (rejected), Qwen2.5-VL's template, 1,024 tokens.
    """
    import shutil

    from packshard.pack import PackConfig, pack_dataset

    folder = multimodal(shared)
    data = root / "data"
    data.mkdir(parents=True)
    for name in ("mllm_demo.json", "mllm_video_demo.json"):
        shutil.copyfile(folder / name, data / name)
    shutil.copytree(folder / "mllm_demo_data", data / "mllm_demo_data")
    settings: dict[str, Any] = {
        "max_seq_len": 1024,
        "template": str(folder / "qwen2_5_vl" / "chat_template.jinja"),
        **options,
    }
    config = PackConfig.build(
        inputs=(str(data / "mllm_demo.json"), str(data / "mllm_video_demo.json")),
        tokenizer=str(shared / "tokenizers" / "qwen3"),
        out=str(root / "out"),
        **settings,
    )
    pack_dataset(config)
    return root / "out"
