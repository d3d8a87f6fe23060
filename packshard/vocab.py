"""Every option vocabulary, defined once: the command line offers exactly these choices.

``--format``, ``--loss`` (and what ``auto`` resolves to per record format), ``--on-error``,
``--strategy``, ``--overlong``, ``--compression``, ``--reasoning``, ``--empty-reasoning``,
``--turns``, ``export --to``, and the label paths and roles records are labelled with.  Every
stage validates its options against these with :func:`check_choice`.
"""

from __future__ import annotations

from collections.abc import Sequence

from packshard.errors import UsageError

FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion", "text")
"""Record formats (``--format`` also takes ``auto``: detect per record)."""
FORMAT_CHOICES = ("auto", *FORMATS)
ROLES = ("system", "user", "assistant", "tool")
LOSS_POLICIES = ("auto", "assistant", "last_assistant", "all", "completion")
"""``--loss``: ``auto`` resolves per record format (:data:`AUTO_LOSS`)."""
AUTO_LOSS = {
    "messages": "assistant",
    "sharegpt": "assistant",
    "alpaca": "assistant",
    "prompt_completion": "completion",
    "text": "all",
}
"""What ``--loss auto`` means for each record format (recorded in the manifest)."""
ON_ERROR = ("skip", "fail")
STRATEGIES = ("bfd", "ffd", "wrapped")
"""``--strategy``: best-fit decreasing, first-fit decreasing, or a stream cut into rows."""
OVERLONG_POLICIES = ("drop", "truncate", "split", "error")
COMPRESSIONS = ("zstd", "snappy", "none")
EXPORT_TARGETS = ("megatron", "torchtune", "mds", "unpacked")
"""``packshard export --to``: each a module of :mod:`packshard.export`."""
CHECKS = ("integrity", "structure", "source", "model")
"""The checks ``verify`` runs, in order (:mod:`packshard.verify.run`)."""
LABEL_PATHS = ("generation_tags", "offsets", "none")
"""How a record's trained characters are found (see :mod:`packshard.ingest.templates`)."""
REASONING_POLICIES = ("train", "mask", "drop")
"""``--reasoning``: train it with the answer, keep it untrained, or remove it before rendering."""
EMPTY_REASONING = ("train", "mask")
"""``--empty-reasoning``: what to do with an empty reasoning block a template renders."""
TURN_POLICIES = ("as_rendered", "expand")
"""``--turns``: the conversation once as rendered, or one example per trained turn."""
REASONING_MARKERS = ("<think>", "</think>")
BACKENDS = ("auto", "fast", "reference")
"""``--backend``: which library encodes (:mod:`packshard.ingest.backends`); auto proves the fast
one on a canary and the first records before it trusts it."""
"""Default ``--reasoning-markers``: the opening and closing marker of an inline block."""


def check_choice(option: str, value: str, allowed: Sequence[str]) -> None:
    """Raise :class:`UsageError` unless ``value`` is one of ``allowed`` (named as ``option``)."""
    if value not in allowed:
        raise UsageError(f"{option} {value!r} is not one of {', '.join(allowed)}")


def resolve_loss(loss: str, fmt: str) -> str:
    """Return the loss policy a record of format ``fmt`` is labelled with under ``--loss``."""
    return AUTO_LOSS[fmt] if loss == "auto" else loss
