"""Every shared image-text record: ids equal transformers' processor, vision never trained.

For each record of ``../shared/data/multimodal`` the packed example's ids must equal
``processor(text=processor.apply_chat_template(messages), images=…)["input_ids"]`` with
transformers' own Qwen2-VL processor (placeholders expanded to ``image_grid_thw``), its
labels must train exactly the assistant turns (content and ``<|im_end|>``) and no vision
token, and every other record must be a reject that names its file and line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packshard.ingest.read.inputs import expand_inputs
from packshard.ingest.stream import ingest
from packshard.ingest.template.render import load_template
from packshard.ingest.tokens.tokenizer import load_tokenizer
from packshard.ingest.types import IngestOptions
from packshard.records import IGNORE_INDEX
from tests.ingest.media.vlm import multimodal, qwen_processor

pytestmark = [pytest.mark.torch, pytest.mark.shared_data]

VISION_IDS = (151652, 151653, 151655)  # <|vision_start|>, <|vision_end|>, <|image_pad|>


def _hf_messages(record: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The record as transformers' processors take it: content parts, and the image paths."""
    listed = record.get("images") or record.get("image") or []
    listed = iter(listed if isinstance(listed, list) else [listed])
    turns = record.get("messages") or [
        {"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]}
        for t in record["conversations"]
    ]
    out, paths = [], []
    for turn in turns:
        content = turn["content"]
        parts: list[dict[str, Any]] = []
        if isinstance(content, str):
            for k, piece in enumerate(content.split("<image>")):
                if k:
                    parts.append({"type": "image"})
                    paths.append(next(listed))
                if piece:
                    parts.append({"type": "text", "text": piece})
        else:  # LLaMA-Factory v1 parts
            for part in content:
                if part["type"] == "image_url":
                    parts.append({"type": "image"})
                    paths.append(part["value"])
                else:
                    parts.append({"type": "text", "text": part["value"]})
        out.append({"role": turn["role"], "content": parts})
    return out, paths


def _records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return json.loads(path.read_text())


@pytest.mark.parametrize(
    ("name", "root"),
    [
        ("mllm_demo.json", None),
        ("qwen3_vl_finetune_demo/demo/single_images.json", "qwen3_vl_finetune_demo"),
        ("v1_multimodal_demo.jsonl", "repo"),  # paths written from LLaMA-Factory's root
    ],
)
def test_ids_equal_the_processor(
    shared_data: Path, tmp_path: Path, name: str, root: str | None
) -> None:
    from PIL import Image

    folder = multimodal(shared_data)
    template = folder / "qwen2_5_vl" / "chat_template.jinja"
    proc = qwen_processor(shared_data / "tokenizers" / "qwen3", template)
    bundle = load_tokenizer(str(shared_data / "tokenizers" / "qwen3"))
    tpl = load_template(str(template), bundle)
    media_root = None
    if root == "repo":
        (tmp_path / "data").symlink_to(folder)
        media_root = str(tmp_path)
    elif root is not None:
        media_root = str(folder / root)
    options = IngestOptions(media_root=media_root)
    chunks = list(ingest(expand_inputs([str(folder / name)]), bundle, tpl, options, threads=1))
    assert not [r for c in chunks for r in c.rejects]
    records = _records(folder / name)
    examples = [c.batch.example(i) for c in chunks for i in range(len(c.batch))]
    assert len(examples) == len(records)
    base = Path(media_root or (folder / name).parent)
    for record, (ids, labels) in zip(records, examples, strict=True):
        messages, paths = _hf_messages(record)
        text = proc.apply_chat_template(messages, tokenize=False)
        images = [Image.open(base / p).convert("RGB") for p in paths]
        want = proc(text=[text], images=images, return_tensors="np")["input_ids"][0]
        assert np.array_equal(ids, want)
        assert not np.isin(ids[labels != IGNORE_INDEX], VISION_IDS).any()
        trained = proc.tokenizer.decode(ids[labels != IGNORE_INDEX])
        answers = [
            m["content"][0]["text"] + "<|im_end|>" for m in messages if m["role"] == "assistant"
        ]
        assert trained == "".join(answers)


def test_every_record_packs_or_is_rejected_at_its_line(shared_data: Path) -> None:
    folder = multimodal(shared_data)
    bundle = load_tokenizer(str(shared_data / "tokenizers" / "qwen3"))
    tpl = load_template(str(folder / "qwen2_5_vl" / "chat_template.jinja"), bundle)
    names = ["mllm_demo.json", "mllm_video_demo.json", "v1_multimodal_demo.jsonl"]
    files = expand_inputs([str(folder / n) for n in names])
    chunks = list(ingest(files, bundle, tpl, IngestOptions(), threads=1))
    rejects = [r for c in chunks for r in c.rejects]
    packed = sum(len(c.batch) for c in chunks)
    assert sum(c.records for c in chunks) == 6 + 3 + 24 == packed + len(rejects)
    assert packed == 6
    by_code = {}
    for r in rejects:
        by_code[r.code] = by_code.get(r.code, 0) + 1
        assert r.ref.source.endswith(("mllm_video_demo.json", "v1_multimodal_demo.jsonl"))
        assert r.ref.line >= 1
    assert by_code == {"video_unsupported": 3, "missing_media": 24}
    v1 = [r for r in rejects if r.code == "missing_media"]
    assert [r.ref.line for r in v1] == list(range(1, 25))
    assert "data/mllm_demo_data/" in v1[0].reason and "--media-root" in v1[0].reason


def test_a_text_template_refuses_images(shared_data: Path) -> None:
    folder = multimodal(shared_data)
    bundle = load_tokenizer(str(shared_data / "tokenizers" / "qwen3"))
    tpl = load_template("chatml", bundle)
    files = expand_inputs([str(folder / "mllm_demo.json")])
    (chunk,) = ingest(files, bundle, tpl, IngestOptions(), threads=1)
    assert len(chunk.batch) == 0
    assert {r.code for r in chunk.rejects} == {"media_mismatch"}
    assert "writes no <|image_pad|> placeholder" in chunk.rejects[0].reason
