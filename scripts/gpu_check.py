"""Packed rows on a real accelerator: bf16 equivalence through a varlen path, and throughput.

Two measurements on one Llama-shaped model (hidden 768, 12 layers, 12 heads, SwiGLU 2048,
vocab 32k, tied embeddings: ~110M parameters; ``--tiny`` shrinks it for a CPU smoke run):

1. Equivalence.  A few packed rows go through every packed attention path torch offers
   here, and each example goes through plain causal SDPA alone:

       varlen   torch.nn.attention.varlen.varlen_attn over the flattened row, cu_seqlens
       flex     FlexAttention with a document mask from create_block_mask
       dense    SDPA with an explicit [1, 1, T, T] block-causal mask (works anywhere)

   bf16 has no single right tolerance, so it is measured: the same "alone" forward in
   float32 gives the bf16 noise floor ``floor = max |alone_bf16 - alone_fp32|`` and a path
   passes when ``max |packed_bf16 - alone_bf16| <= 4 * floor`` (each side may be off by
   about one floor; 2x more for the max over many more values).  Cross entropy moves at
   most 2 * max |logit delta|, so the loss delta is reported, not tested separately.  The
   naive control (one causal mask over the row, positions 0..T-1) must differ by more than
   the tolerance, or the check could not have failed.

2. Throughput of training steps (forward, backward, AdamW; bf16 autocast on CUDA) on the
   same examples, two ways with the same worst-case shape [R, max_seq_len]:

       padded   R examples per step, right-padded to the longest, causal SDPA
       packed   R packed rows per step, flattened, the selected packed path (the rows
                stored in ``--data OUT``; else first-fit decreasing over the lengths)

   Useful tokens are non-pad tokens; loss tokens are labels != -100.  Profile arithmetic
   predicts the ratio from the lengths alone: (useful / processed tokens when packed) /
   (useful / processed tokens when padded).

Example:
    python scripts/gpu_check.py --json gpu.json             # CUDA, ~110M model
    python scripts/gpu_check.py --device cpu --tiny         # same code, seconds on a CPU
    python scripts/gpu_check.py --data OUT --json gpu.json  # lengths from packed shards
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 32000
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 2048
    rope_theta: float = 10000.0


TINY = ModelConfig(vocab=512, hidden=64, layers=2, heads=4, intermediate=128)


@dataclass
class Batch:
    """input_ids/labels/positions [B, T]; cu_seqlens set for packed batches (B == 1)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor | None
    useful: int
    loss_tokens: int


# --- model --------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = c.heads, c.hidden // c.heads
        self.norm1, self.norm2 = nn.RMSNorm(c.hidden, eps=1e-5), nn.RMSNorm(c.hidden, eps=1e-5)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden, bias=False)
        self.out = nn.Linear(c.hidden, c.hidden, bias=False)
        self.gate_up = nn.Linear(c.hidden, 2 * c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple, attend) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k = rotate(q, *rope), rotate(k, *rope)
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(y.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLlama(nn.Module):
    """A Llama-shaped decoder (RMSNorm, rotary, SwiGLU) whose attention is passed in."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.config = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.hidden, eps=1e-5)
        half = c.hidden // c.heads // 2
        inv = 1.0 / c.rope_theta ** (torch.arange(half, dtype=torch.float64) / half)
        self.register_buffer("inv_freq", inv.float(), persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attend) -> torch.Tensor:
        angles = positions.float()[..., None] * self.inv_freq  # [B, T, D/2]
        rope = (angles.cos()[:, :, None], angles.sin()[:, :, None])
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, rope, attend)
        return self.norm(x) @ self.embed.weight.T  # tied head


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x.float().chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


# --- attention paths ----------------------------------------------------------------------


def available_paths(device: torch.device) -> list[str]:
    """Packed attention paths usable here, best first (the first one must train)."""
    paths = []
    if device.type == "cuda":
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401

            paths.append("varlen")
        except ImportError:
            pass
    try:
        from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401

        paths.append("flex")  # on a CPU: forward only (no backward), so after dense
    except ImportError:
        pass
    return [*paths, "dense"] if device.type == "cuda" else ["dense", *paths]


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


_FLEX: dict[str, object] = {}


def packed_attention(path: str, cu: torch.Tensor, total: int):
    """Return ``attend(q, k, v)`` isolating the segments of one flattened row [1, H, T, D]."""
    seg = torch.repeat_interleave(
        torch.arange(cu.numel() - 1, device=cu.device), cu.diff(), output_size=total
    )
    if path == "dense":
        mask = (seg[:, None] == seg[None, :]).tril()[None, None]
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if path == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def document(b, h, qi, ki):
            return (seg[qi] == seg[ki]) & (qi >= ki)

        block = create_block_mask(
            document, None, None, total, total, device=cu.device, _compile=cu.is_cuda
        )
        if "fn" not in _FLEX:  # eager on a CPU: slow and warns, but needs no compiler
            warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
            _FLEX["fn"] = torch.compile(flex_attention) if cu.is_cuda else flex_attention
        flex = _FLEX["fn"]
        return lambda q, k, v: flex(q, k, v, block_mask=block)
    if path == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        cu32 = cu.to(torch.int32)
        longest = int(cu.diff().max())
        params = inspect.signature(varlen_attn).parameters
        extra = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}

        def attend(q, k, v):
            q, k, v = (x[0].transpose(0, 1).contiguous() for x in (q, k, v))  # [T, H, D]
            out = varlen_attn(q, k, v, cu32, cu32, longest, longest, **extra)
            return out.transpose(0, 1)[None]

        return attend
    raise ValueError(f"unknown attention path {path!r}")


# --- data ---------------------------------------------------------------------------------


def read_shards(out: Path, max_rows: int):
    """Return (examples' ids, examples' labels, max_seq_len, rows) from a packshard OUT folder.

    Reads the contract columns with pyarrow directly; each segment of a row is one example,
    and ``rows`` lists each stored row's example indices (the packed side uses them as is).
    """
    import pyarrow.parquet as pq

    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    files = [out / s["path"] for s in manifest.get("shards", [])]
    files = files or sorted(p for p in out.rglob("*.parquet") if p.name != "examples.parquet")
    if not files:
        raise SystemExit(f"{out}: no shards found (pack a dataset first: packshard pack … -o OUT)")
    ids_out: list[np.ndarray] = []
    labels_out: list[np.ndarray] = []
    members: list[list[int]] = []
    longest = rows = 0
    for path in files:
        table = pq.read_table(path, columns=["input_ids", "labels", "cu_seqlens"])
        for batch in table.to_batches():
            x, y, c = (batch.column(n) for n in ("input_ids", "labels", "cu_seqlens"))
            x_val, y_val, c_val = (a.values.to_numpy() for a in (x, y, c))
            x_off, c_off = x.offsets.to_numpy(), c.offsets.to_numpy()
            for r in range(min(len(batch), max_rows - rows)):
                cu = x_off[r] + c_val[c_off[r] : c_off[r + 1]].astype(np.int64)
                longest = max(longest, int(cu[-1] - cu[0]))
                members.append(list(range(len(ids_out), len(ids_out) + cu.size - 1)))
                for a, b in pairwise(cu.tolist()):
                    ids_out.append(x_val[a:b].astype(np.int64))
                    labels_out.append(y_val[a:b].astype(np.int64))
            rows += min(len(batch), max_rows - rows)
            if rows >= max_rows:
                break
        if rows >= max_rows:
            break
    max_len = int(manifest.get("config", {}).get("max_seq_len", longest))
    return ids_out, labels_out, max_len, members


def synthetic_examples(n: int, max_len: int, vocab: int, rng: np.random.Generator):
    """Chat-like lengths: lognormal, median max_len / 12, clipped to [8, max_len]."""
    lengths = np.clip(rng.lognormal(math.log(max_len / 12), 1.0, n), 8, max_len).astype(np.int64)
    ids = [rng.integers(0, vocab, k) for k in lengths]
    labels = []
    for x in ids:
        lab = x.copy()
        lab[: max(1, len(x) // 3)] = IGNORE_INDEX  # a prompt part without loss
        labels.append(lab)
    return ids, labels


def plan_rows(lengths: np.ndarray, max_len: int) -> list[list[int]]:
    """First-fit decreasing: example indices per row (the packer's job, redone simply here)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(int(i))
                room[r] -= n
                break
        else:
            rows.append([int(i)])
            room.append(max_len - n)
    return rows


def make_packed(ids, labels, members, device, pad_to: int = 0) -> Batch:
    """One flattened packed batch: positions reset, each segment's first label -100.

    ``pad_to`` appends one segment of pad tokens (label -100) up to that many tokens, so
    that a compiled kernel sees one shape (FlexAttention recompiles for every new length).
    """
    segs = [i for row in members for i in row]
    lengths = [len(ids[i]) for i in segs]
    useful = sum(lengths)
    x = np.concatenate([ids[i] for i in segs])
    y = np.concatenate([labels[i] for i in segs])
    if pad_to > useful:
        lengths.append(pad_to - useful)
        x = np.concatenate([x, np.zeros(pad_to - useful, np.int64)])
        y = np.concatenate([y, np.full(pad_to - useful, IGNORE_INDEX, np.int64)])
    cu = np.concatenate([[0], np.cumsum(lengths)])
    y[cu[:-1]] = IGNORE_INDEX
    pos = np.arange(cu[-1]) - np.repeat(cu[:-1], lengths)
    t = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)[None]  # noqa: E731
    return Batch(t(x), t(y), t(pos), t(cu)[0], useful, int((y[1:] != IGNORE_INDEX).sum()))


def make_padded(ids, labels, members, device) -> Batch:
    """R examples right-padded to the longest of them (pads: token 0, label -100)."""
    longest = max(len(ids[i]) for i in members)
    x = np.zeros((len(members), longest), np.int64)
    y = np.full((len(members), longest), IGNORE_INDEX, np.int64)
    for r, i in enumerate(members):
        x[r, : len(ids[i])], y[r, : len(ids[i])] = ids[i], labels[i]
        y[r, 0] = IGNORE_INDEX
    pos = np.tile(np.arange(longest), (len(members), 1))
    t = lambda a: torch.as_tensor(a, dtype=torch.long, device=device)  # noqa: E731
    useful = sum(len(ids[i]) for i in members)
    return Batch(t(x), t(y), t(pos), None, useful, int((y[:, 1:] != IGNORE_INDEX).sum()))


# --- measurements -------------------------------------------------------------------------


def shifted_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX
    )


def check_equivalence(model, rows, ids, labels, path, device, dtype) -> dict:
    """Packed rows through ``path`` vs each example alone (causal SDPA); bf16 and fp32."""
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    packed_delta = floor = control = loss_delta = 0.0
    control_min = math.inf
    for members in rows:
        batch = make_packed(ids, labels, [members], device)
        cu = batch.cu_seqlens
        assert cu is not None
        with torch.no_grad():
            with autocast:
                attend = packed_attention(path, cu, batch.useful)
                packed = model(batch.input_ids, batch.positions, attend)[0].float()
                naive_pos = torch.arange(batch.useful, device=device)[None]
                naive = model(batch.input_ids, naive_pos, causal)[0].float()
            for j, (a, b) in enumerate(pairwise(cu.tolist())):
                seg_ids, seg_pos = batch.input_ids[:, a:b], batch.positions[:, a:b]
                with autocast:
                    alone = model(seg_ids, seg_pos, causal)[0].float()
                exact = model(seg_ids, seg_pos, causal)[0].float()
                packed_delta = max(packed_delta, float((packed[a:b] - alone).abs().max()))
                floor = max(floor, float((alone - exact).abs().max()))
                seg_labels = batch.labels[:, a:b]
                if int((seg_labels[:, 1:] != IGNORE_INDEX).sum()):
                    lp = shifted_loss(packed[None, a:b], seg_labels)
                    la = shifted_loss(alone[None], seg_labels)
                    loss_delta = max(loss_delta, float((lp - la).abs()))
                if j > 0:
                    leak = float((naive[a:b] - alone).abs().max())
                    control = max(control, leak)
                    control_min = min(control_min, leak)
    tolerance = 4 * floor if dtype != torch.float32 else 1e-4
    multi = control_min != math.inf
    detected = multi and control_min > tolerance
    return {
        "path": path,
        "rows": len(rows),
        "segments": sum(len(r) for r in rows),
        "max_logit_delta": packed_delta,
        "max_loss_delta": loss_delta,
        "noise_floor": floor,
        "tolerance": tolerance,
        "control_min_delta": control_min if multi else None,
        "control_max_delta": control if multi else None,
        "control_detected": detected,
        "ok": packed_delta <= tolerance and detected,
    }


def train_steps(model, batches, path, device, dtype, seconds, warmup=2, min_steps=3) -> dict:
    """Time training steps over ``batches`` (cycled) for about ``seconds`` after warm-up."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps = useful = loss_tokens = processed = 0
    start = 0.0
    k = 0
    while True:
        if steps == warmup:
            sync()
            start = time.perf_counter()
        batch = batches[k % len(batches)]
        k += 1
        if batch.cu_seqlens is None:
            attend = causal
        else:
            attend = packed_attention(path, batch.cu_seqlens, batch.input_ids.shape[1])
        with autocast:
            logits = model(batch.input_ids, batch.positions, attend)
        loss = shifted_loss(logits, batch.labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps > warmup:
            useful += batch.useful
            loss_tokens += batch.loss_tokens
            processed += batch.input_ids.numel()
            if steps - warmup >= min_steps:
                sync()
                if time.perf_counter() - start >= seconds:
                    break
    elapsed = time.perf_counter() - start
    return {
        "steps": steps - warmup,
        "seconds": elapsed,
        "tokens_per_s": processed / elapsed,
        "useful_tokens_per_s": useful / elapsed,
        "loss_tokens_per_s": loss_tokens / elapsed,
        "useful_fraction": useful / processed,
        "final_loss": float(loss.detach()),
    }


def describe(lengths: np.ndarray) -> dict:
    p = np.percentile(lengths, [50, 90, 99])
    return {
        "examples": int(lengths.size),
        "tokens": int(lengths.sum()),
        "p50": float(p[0]),
        "p90": float(p[1]),
        "p99": float(p[2]),
        "max": int(lengths.max()),
    }


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda or cpu (default cuda)")
    ap.add_argument("--tiny", action="store_true", help="tiny model and sizes: a smoke run")
    ap.add_argument("--data", type=Path, help="packshard OUT folder to take examples from")
    ap.add_argument("--attn", default="auto", help="packed path: auto|varlen|flex|dense")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--max-seq-len", type=int, help="row capacity (default 4096; 256 tiny)")
    ap.add_argument("--rows-per-step", type=int, help="packed rows = padded examples per step")
    ap.add_argument("--examples", type=int, help="synthetic examples (default 4000; 400 tiny)")
    ap.add_argument("--max-rows", type=int, default=2048, help="rows read from --data")
    ap.add_argument("--check-paths", help="comma list of paths to check (default: all here)")
    ap.add_argument("--check-rows", type=int, default=4, help="rows in the equivalence check")
    ap.add_argument("--seconds", type=float, help="timed seconds per mode (60; 1 tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the results to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here (use --device cpu --tiny for a smoke run)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    config = TINY if args.tiny else ModelConfig()
    max_len = args.max_seq_len or (256 if args.tiny else 4096)
    rng = np.random.default_rng(args.seed)
    if args.data is not None:
        ids, labels, max_len, rows = read_shards(args.data, args.max_rows)
        source = str(args.data)
        vocab = int(max(int(x.max()) for x in ids) + 1)
        config = ModelConfig(**{**asdict(config), "vocab": max(config.vocab, vocab)})
    else:
        n = args.examples or (400 if args.tiny else 4000)
        ids, labels = synthetic_examples(n, max_len, config.vocab, rng)
        rows = plan_rows(np.array([len(x) for x in ids]), max_len)
        source = (
            f"synthetic lognormal(median {max_len // 12}, sigma 1.0), clipped to [8, {max_len}]"
        )
    lengths = np.array([len(x) for x in ids])

    paths = available_paths(device)
    path = paths[0] if args.attn == "auto" else args.attn
    if path not in paths:
        print(f"attention path {path!r} is not available here (have: {paths})", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    model = TinyLlama(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"device {device} torch {torch.__version__} dtype {args.dtype}")
    print(f"model {params / 1e6:.1f}M parameters; data {source}: {len(ids)} examples")
    print(f"packed attention path: {path} (available: {', '.join(paths)})")

    multi = [r for r in rows if len(r) > 1] or rows
    check = multi[: args.check_rows]
    equivalence = {}
    wanted = args.check_paths.split(",") if args.check_paths else paths
    for p in [path, *(q for q in wanted if q != path)]:
        try:
            equivalence[p] = check_equivalence(model, check, ids, labels, p, device, dtype)
        except Exception as exc:  # a path that fails here is a result to report
            equivalence[p] = {"path": p, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"equivalence [{p}]: {json.dumps(equivalence[p])}")

    per_step = args.rows_per_step or (4 if args.tiny else 8)
    order = rng.permutation(len(ids))
    padded = [
        make_padded(ids, labels, order[i : i + per_step].tolist(), device)
        for i in range(0, len(order), per_step)
    ]
    pad_to = -(-per_step * max_len // 128) * 128 if path == "flex" else 0
    packed = [
        make_packed(ids, labels, rows[i : i + per_step], device, pad_to)
        for i in range(0, len(rows), per_step)
    ]
    seconds = args.seconds if args.seconds is not None else (1.0 if args.tiny else 60.0)
    throughput = {}
    for mode, batches in (("padded", padded), ("packed", packed)):
        torch.manual_seed(args.seed)
        trained = TinyLlama(config).to(device)
        throughput[mode] = train_steps(trained, batches, path, device, dtype, seconds)
        print(f"throughput [{mode}]: {json.dumps(throughput[mode])}")
        del trained
    frac_pad = sum(b.useful for b in padded) / sum(b.input_ids.numel() for b in padded)
    frac_pack = sum(b.useful for b in packed) / sum(b.input_ids.numel() for b in packed)
    fill = int(lengths.sum()) / (len(rows) * max_len)  # rows stored at max_seq_len, as profiled
    measured = (
        throughput["packed"]["useful_tokens_per_s"] / throughput["padded"]["useful_tokens_per_s"]
    )
    ok = all(bool(e.get("ok")) for e in equivalence.values())
    result = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": args.dtype,
        "attention_path": path,
        "attention_paths_available": paths,
        "model": {**asdict(config), "parameters": params},
        "data": {
            "source": source,
            "max_seq_len": max_len,
            "rows": len(rows),
            "rows_per_step": per_step,
            **describe(lengths),
        },
        "equivalence": equivalence,
        "throughput": {
            **throughput,
            "measured_ratio": measured,
            "predicted_ratio": frac_pack / frac_pad,
            "useful_fraction_padded": frac_pad,
            "useful_fraction_packed": frac_pack,
            "packed_fill_rate": fill,
            "predicted_ratio_fixed_rows": fill / frac_pad,
        },
        "ok": ok,
    }
    print(
        f"useful tokens/s packed/padded: measured {measured:.2f}x, "
        f"predicted {frac_pack / frac_pad:.2f}x from the lengths"
    )
    print(f"equivalence through {', '.join(equivalence)}: {'ok' if ok else 'FAILED'}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
