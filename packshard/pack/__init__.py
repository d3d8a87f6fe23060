"""``packshard pack``: from input files to an audited, atomically published output folder.

``PackConfig``, ``PackResult`` and ``pack_dataset`` are imported on first use (PEP 562), so
that importing one of the step's modules (``packshard.pack.plan.mix`` for ``profile``'s
options, say) does not import the whole pipeline and numba with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packshard.pack.config import PackConfig
    from packshard.pack.finish import PackResult
    from packshard.pack.pipeline import pack_dataset

__all__ = ["PackConfig", "PackResult", "pack_dataset"]


def __getattr__(name: str) -> Any:
    if name == "PackConfig":
        from packshard.pack.config import PackConfig

        return PackConfig
    if name == "PackResult":
        from packshard.pack.finish import PackResult

        return PackResult
    if name == "pack_dataset":
        from packshard.pack.pipeline import pack_dataset

        return pack_dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
