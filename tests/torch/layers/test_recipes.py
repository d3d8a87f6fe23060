"""The Trainer recipe on a hybrid model: refused as built, exact after segment_layers."""

from __future__ import annotations

import pytest

from tests.torch.layers.builders import tiny

torch = pytest.importorskip("torch")


@pytest.mark.trainers
def test_trainer_on_a_gated_delta_net_model(marked_pack, tmp_path, torch_one_thread) -> None:
    from transformers import Trainer, TrainingArguments

    from packshard.torch import (
        PackedDataset,
        SeamLeakError,
        check_trainer,
        collate_hf,
        segment_layers,
    )
    from tests.helpers import LossProbe, marked_examples

    args = TrainingArguments(
        output_dir=str(tmp_path), report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, logging_strategy="no", learning_rate=1e-2,
        per_device_train_batch_size=2, max_steps=3,
    )  # fmt: skip
    model = tiny("qwen3_next")
    trainer = Trainer(model=model, args=args, train_dataset=PackedDataset(marked_pack),
                      data_collator=collate_hf)  # fmt: skip
    with pytest.raises(SeamLeakError, match=r"first at layer 0 \(Qwen3NextGatedDeltaNet"):
        check_trainer(trainer)  # the recipe of an attention-only model leaks here
    segment_layers(model)
    check_trainer(trainer)
    probe = LossProbe(model, marked_examples(marked_pack))
    trainer.train()
    assert len(probe.records) == 3
    assert max(abs(r["fed"] - r["alone"]) for r in probe.records) < 1e-5
    assert max(abs(r["naive"] - r["alone"]) for r in probe.records) > 1e-3  # the live control
