"""``packshard profile``: how long the examples are and what padding, bucketing and packing cost."""

from packshard.profile.config import ProfileConfig
from packshard.profile.export import report_to_dict
from packshard.profile.gather import describe_label_paths, profile_chunks
from packshard.profile.lengths import (
    HISTOGRAM_BINS_PER_OCTAVE,
    PERCENTILE_METHOD,
    PERCENTILES,
    STRATEGIES,
    LengthStats,
    Utilization,
    compute_histogram_edges,
    measure_batches,
    measure_lengths,
    measure_utilization,
)
from packshard.profile.report import (
    MAX_LISTED_REJECTS,
    DomainProfile,
    ProfileReport,
    profile_lengths,
    write_verdict,
)
from packshard.profile.units import profile_inputs

__all__ = [
    "HISTOGRAM_BINS_PER_OCTAVE",
    "MAX_LISTED_REJECTS",
    "PERCENTILES",
    "PERCENTILE_METHOD",
    "STRATEGIES",
    "DomainProfile",
    "LengthStats",
    "ProfileConfig",
    "ProfileReport",
    "Utilization",
    "compute_histogram_edges",
    "describe_label_paths",
    "measure_batches",
    "measure_lengths",
    "measure_utilization",
    "profile_chunks",
    "profile_inputs",
    "profile_lengths",
    "report_to_dict",
    "write_verdict",
]
