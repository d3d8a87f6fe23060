"""The profile report as JSON-ready data (``packshard profile --json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from packshard.profile.report import (
    KEEP_SHARE,
    DomainProfile,
    ProfileReport,
    describe_fit,
    overlong_effect,
)


def report_to_dict(report: ProfileReport) -> dict[str, Any]:
    """Return the report as JSON-ready data: fixed keys, fractions rounded to 6 places."""

    def domain_to_dict(d: DomainProfile) -> dict[str, Any]:
        counts = ("records", "examples", "rejected", "tokens", "loss_tokens", "prompt_tokens")
        reasoning = (f"reasoning_{k}" for k in ("examples", "tokens", "loss_tokens", "loss_share"))
        keys = ("name", *counts, "over_max", "loss_share", "over_max_share", *reasoning)
        # the shares are the only floats: rounded
        data = {k: round(v, 6) if isinstance(v := getattr(d, k), float) else v for k in keys}
        s = d.lengths
        data["lengths"] = None if s is None else {**asdict(s), "mean": round(s.mean, 3)}
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
        data["fit"] = {  # what --overlong does at max_seq_len; the length that keeps most
            "over_max_tokens": d.over_max_tokens,
            "over_max_parts": d.over_max_parts,
            "keep_length": d.keep_length,
            "effect": overlong_effect(d, report.overlong, report.max_seq_len),
        }
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
        "fit": {
            "overlong": report.overlong,
            "keep_share": KEEP_SHARE,
            "advice": describe_fit(report),
        },
        **({"mixture": dict(report.mixture)} if report.mixture else {}),  # --mix, predicted
    }
    if report.pairs:  # preference pairs: shares and the padded DPO loader's waste
        out["pairs"] = dict(report.pairs)
    if report.vision:  # images: vision tokens, image sizes, a padded VLM batch's waste
        out["vision"] = dict(report.vision)
    return out
