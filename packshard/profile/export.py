"""The profile report as JSON-ready data (``packshard profile --json``)."""

from __future__ import annotations

from typing import Any

from packshard.profile.report import DomainProfile, ProfileReport


def report_to_dict(report: ProfileReport) -> dict[str, Any]:
    """Return the report as JSON-ready data: fixed keys, fractions rounded to 6 places."""

    def domain_to_dict(d: DomainProfile) -> dict[str, Any]:
        counts = ("name", "records", "examples", "rejected", "tokens", "loss_tokens")
        data = {key: getattr(d, key) for key in (*counts, "prompt_tokens", "over_max")}
        data["loss_share"] = round(d.loss_share, 6)
        data["over_max_share"] = round(d.over_max_share, 6)
        for key in ("reasoning_examples", "reasoning_tokens", "reasoning_loss_tokens"):
            data[key] = getattr(d, key)
        data["reasoning_loss_share"] = round(d.reasoning_loss_share, 6)
        data["lengths"] = None
        if d.lengths is not None:
            data["lengths"] = {k: getattr(d.lengths, k) for k in ("p50", "p90", "p95", "p99")}
            data["lengths"].update(max=d.lengths.max, mean=round(d.lengths.mean, 3))
        data["utilization"] = {
            u.strategy: {
                "rows": u.rows,
                "computed_tokens": u.computed_tokens,
                "useful_tokens": u.useful_tokens,
                "useful_fraction": round(u.fraction, 6),
            }
            for u in d.utilization
        }
        data["lower_bound_rows"] = d.lower_bound_rows
        data["histogram"] = list(d.histogram)
        return data

    out = {
        "max_seq_len": report.max_seq_len,
        "batch_size": report.batch_size,
        "seed": report.seed,
        "label_path": report.label_path,
        "percentile_method": report.percentile_method,
        "overlong": "clipped to max_seq_len (counted as truncated) in every strategy",
        "histogram_edges": list(report.histogram_edges),
        "total": domain_to_dict(report.total),
        "domains": [domain_to_dict(d) for d in report.domains],
        "verdict": report.verdict,
        "packed_shape": dict(report.shape),  # row fill spread, trained tokens per step
        **({"mixture": dict(report.mixture)} if report.mixture else {}),  # --mix, predicted
    }
    if report.pairs:  # preference pairs: shares and the padded DPO loader's waste
        out["pairs"] = dict(report.pairs)
    return out
