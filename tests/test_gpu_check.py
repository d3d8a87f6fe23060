"""The accelerator check script, run on the CPU with a tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from tests.helpers import REPO

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, scope="module")
def one_thread(torch_one_thread):
    """Every test here runs torch on one intra-op thread (see conftest)."""


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


TINY_ARGS = ["--device", "cpu", "--tiny", "--seconds", "0", "--check-rows", "2"]


def test_tiny_cpu_run_reports_every_field(gc, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    rc = gc.main([*TINY_ARGS, "--examples", "120", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "packed attention path: dense (available: dense" in printed
    data = json.loads(out.read_text())
    assert data["attention_path"] == "dense" and data["ok"] is True
    assert data["device"] == "cpu" and data["dtype"] == "bf16"
    assert data["data"]["examples"] == 120 and data["data"]["max_seq_len"] == 256
    eq = data["equivalence"]["dense"]
    assert eq["ok"] and eq["control_detected"]
    assert eq["max_logit_delta"] <= eq["tolerance"] == pytest.approx(4 * eq["noise_floor"])
    assert eq["control_min_delta"] > 10 * eq["tolerance"]
    if "flex" in data["attention_paths_available"]:
        assert data["equivalence"]["flex"]["ok"]
    tp = data["throughput"]
    for mode in ("padded", "packed"):
        assert tp[mode]["steps"] == 3  # --seconds 0: the minimum after warm-up
        assert tp[mode]["useful_tokens_per_s"] > 0
        assert tp[mode]["loss_tokens_per_s"] < tp[mode]["useful_tokens_per_s"]
    assert tp["packed"]["useful_fraction"] == 1.0 and tp["useful_fraction_packed"] == 1.0
    assert 0 < tp["useful_fraction_padded"] < 1
    assert tp["predicted_ratio"] == pytest.approx(1 / tp["useful_fraction_padded"])
    assert tp["measured_ratio"] > 0
    assert 0 < tp["packed_fill_rate"] <= 1


def test_plan_rows_is_first_fit_decreasing(gc):
    # sorted 5, 4, 3, 2 into rows of 8: 5 -> row 0, 4 -> row 1, 3 -> row 0, 2 -> row 1
    assert gc.plan_rows(np.array([5, 3, 4, 2]), 8) == [[0, 1], [2, 3]]


def test_make_packed_resets_positions_and_masks_seams(gc):
    ids = [np.arange(1, 6), np.arange(10, 13)]
    labels = [x.copy() for x in ids]
    batch = gc.make_packed(ids, labels, [[0, 1]], torch.device("cpu"), pad_to=10)
    assert batch.cu_seqlens.tolist() == [0, 5, 8, 10]
    assert batch.positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1]]
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 10, 11, 12, 0, 0]]
    assert batch.labels.tolist() == [[-100, 2, 3, 4, 5, -100, 11, 12, -100, -100]]
    assert batch.useful == 8 and batch.loss_tokens == 6


def test_make_padded_pads_right_without_loss(gc):
    ids = [np.array([7, 8, 9]), np.array([4])]
    batch = gc.make_padded(ids, [x.copy() for x in ids], [0, 1], torch.device("cpu"))
    assert batch.input_ids.tolist() == [[7, 8, 9], [4, 0, 0]]
    assert batch.labels.tolist() == [[-100, 8, 9], [-100, -100, -100]]
    assert batch.positions.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert batch.useful == 4 and batch.loss_tokens == 2 and batch.cu_seqlens is None


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """What a varlen kernel computes, with dense SDPA per segment ([T, H, D] layout)."""
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k)
    assert max_q == max_k == int(cu_q.diff().max())
    assert causal
    out = torch.empty_like(q)
    for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        seg = [x[a:b].transpose(0, 1) for x in (q, k, v)]
        out[a:b] = torch.nn.functional.scaled_dot_product_attention(*seg, is_causal=True).transpose(
            0, 1
        )
    return out


def new_style(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)):
    return reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, tuple(window_size) == (-1, 0))


def old_style(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False):
    return reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal)


@pytest.mark.parametrize("kernel", [new_style, old_style])
def test_varlen_path_calls_the_kernel_right(gc, monkeypatch, kernel):
    varlen = pytest.importorskip("torch.nn.attention.varlen")
    monkeypatch.setattr(varlen, "varlen_attn", kernel)
    cu = torch.tensor([0, 3, 7, 8])
    q, k, v = (
        torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    got = gc.packed_attention("varlen", cu, 8)(q, k, v)
    want = gc.packed_attention("dense", cu, 8)(q, k, v)
    assert got.shape == (1, 2, 8, 4)
    assert torch.allclose(got, want, atol=1e-6)


def test_leaking_path_fails_the_check(gc, monkeypatch):
    torch.manual_seed(0)
    model = gc.TinyLlama(gc.TINY)
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 512, n) for n in (20, 30, 25)]
    labels = [x.copy() for x in ids]
    monkeypatch.setattr(gc, "packed_attention", lambda path, cu, total: gc.causal)
    res = gc.check_equivalence(
        model, [[0, 1, 2]], ids, labels, "dense", torch.device("cpu"), torch.bfloat16
    )
    assert not res["ok"] and res["max_logit_delta"] > 10 * res["tolerance"]


def write_out(folder, rows):
    """A minimal OUT folder: one shard with the contract columns and a manifest."""
    folder.mkdir()
    cols = {"input_ids": [], "labels": [], "position_ids": [], "cu_seqlens": []}
    for lengths in rows:
        cu = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.arange(cu[-1]) % 97 + 1
        lab = ids.copy()
        lab[cu[:-1]] = -100
        cols["input_ids"].append(ids.tolist())
        cols["labels"].append(lab.tolist())
        cols["position_ids"].append((np.arange(cu[-1]) - np.repeat(cu[:-1], lengths)).tolist())
        cols["cu_seqlens"].append(cu.tolist())
    table = pa.table({k: pa.array(v, pa.list_(pa.int32())) for k, v in cols.items()})
    pq.write_table(table, folder / "shard-00000.parquet")
    manifest = {"config": {"max_seq_len": 64}, "shards": [{"path": "shard-00000.parquet"}]}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_data_comes_from_packed_shards(gc, tmp_path):
    write_out(tmp_path / "out", [[20, 30, 10], [64], [15, 15, 15, 15], [40, 12]])
    ids, labels, max_len, rows = gc.read_shards(tmp_path / "out", max_rows=1000)
    assert max_len == 64 and rows == [[0, 1, 2], [3], [4, 5, 6, 7], [8, 9]]
    assert [len(x) for x in ids] == [20, 30, 10, 64, 15, 15, 15, 15, 40, 12]
    assert ids[1][0] == 21 and labels[1][0] == -100 and labels[1][1] == ids[1][1]
    assert len(gc.read_shards(tmp_path / "out", max_rows=2)[0]) == 4
    out = tmp_path / "gpu.json"
    args = ["--check-paths", "dense", "--dtype", "fp32", "--data", str(tmp_path / "out")]
    rc = gc.main([*TINY_ARGS, *args, "--json", str(out)])
    data = json.loads(out.read_text())
    assert rc == 0 and data["data"]["examples"] == 10 and data["data"]["max_seq_len"] == 64
    assert data["data"]["source"] == str(tmp_path / "out")
    assert data["data"]["rows"] == 4  # the stored rows, not re-planned
    assert list(data["equivalence"]) == ["dense"]
    eq = data["equivalence"]["dense"]
    assert eq["tolerance"] == 1e-4 and eq["max_logit_delta"] < 1e-5 and eq["ok"]


def test_cuda_missing_is_a_usage_error(gc, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gc.main(["--device", "cuda"]) == 2
    assert "use --device cpu --tiny" in capsys.readouterr().err
