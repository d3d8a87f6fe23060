"""The values that cross stages: a record's place, a reject, a packed row, ``IGNORE_INDEX``.

Ingest, pack, verify, the reader and the exporters all speak of records by
:class:`SourceRef` (``file:line``) and of unusable ones as :class:`Reject` values, each with a
registered ``code`` (:data:`packshard.errors.REJECT_CODES`); a shard row is a
:class:`PackedRow`.  The values only ingest makes are in :mod:`packshard.ingest.types`.
``IGNORE_INDEX`` is defined by :mod:`packshard.arrays` (the leaf that counts trained labels)
and named here too, where the stages import it.

The values made once per record or turn are :func:`quick` records: frozen and slotted like
every value here, built by an ``__init__`` that fills the slots directly (see there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import numpy as np

from packshard.arrays import IGNORE_INDEX as IGNORE_INDEX
from packshard.errors import REJECT_CODES

T = TypeVar("T")


def quick(cls: type[T]) -> type[T]:
    """Give a frozen, slotted dataclass an ``__init__`` that fills its slots directly.

    A frozen dataclass's own ``__init__`` stores each field through ``object.__setattr__``;
    this one calls each slot's descriptor (five fields: 370 instead of 950 ns).  Only
    ``__init__`` changes, and the instance stays frozen; fields with a ``default_factory`` or
    ``init=False`` are not supported.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    namespace: dict[str, Any] = {}
    params: list[str] = []
    keywords: list[str] = []
    body: list[str] = []
    for f in fields:
        if not f.init or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"quick: {cls.__name__}.{f.name} is not a plain field")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        param = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        (keywords if f.kw_only else params).append(param)
        body.append(f"    _set_{f.name}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *params, *(["*", *keywords] if keywords else [])])
    source = f"def __init__({signature}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # field names of our own classes, as dataclasses itself does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__, init.__annotations__ = cls.__init__.__doc__, cls.__init__.__annotations__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@quick
@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a record came from: the input path as given and its 1-based line (or row)."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


class SourceRefs(Sequence[SourceRef]):
    """Many records' :class:`SourceRef` values as columns: a name per code, a line each.

    A value is made only when one is asked for (``refs[i]``), so a batch of a million
    examples from a few inputs (``repack``'s) costs two arrays, not a million objects (1.9 s
    to make them on a loaded 2-core machine).  ``names[codes[i]]`` is record ``i``'s input.
    """

    __slots__ = ("codes", "lines", "names")

    def __init__(self, names: tuple[str, ...], codes: np.ndarray, lines: np.ndarray) -> None:
        self.names = names
        self.codes = codes
        self.lines = lines

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, i: int) -> SourceRef: ...

    @overload
    def __getitem__(self, i: slice) -> SourceRefs: ...

    def __getitem__(self, i: int | slice) -> SourceRef | SourceRefs:
        if isinstance(i, slice):
            return SourceRefs(self.names, self.codes[i], self.lines[i])
        return SourceRef(self.names[int(self.codes[i])], int(self.lines[i]))


@dataclass(frozen=True, slots=True)
class Reject:
    """A record that was not packed: rejected at ingest or dropped by a policy.

    ``code`` is registered in :data:`packshard.errors.REJECT_CODES`, which also says whether it
    is a rejection (bad input) or a drop (a policy).
    """

    ref: SourceRef
    domain: str
    code: str
    reason: str

    def __post_init__(self) -> None:
        assert self.code in REJECT_CODES, f"unregistered reject code {self.code!r}"

    @property
    def kind(self) -> str:
        """``rejected`` or ``dropped``, from the code's registry entry."""
        return REJECT_CODES[self.code].kind


@dataclass(frozen=True, slots=True)
class PackedRow:
    """One packed row as stored in a shard (the contract's per-row columns).

    ``cu_seqlens`` is ``[0, end_1, …, num_tokens]``; segment ``j`` spans
    ``cu_seqlens[j]:cu_seqlens[j+1]`` and belongs to ``example_ids[j]``.
    """

    input_ids: np.ndarray  # int32 [num_tokens]
    labels: np.ndarray  # int32 [num_tokens]
    position_ids: np.ndarray  # int32 [num_tokens]
    cu_seqlens: np.ndarray  # int32 [num_segments + 1]
    example_ids: np.ndarray  # int64 [num_segments]

    @property
    def num_tokens(self) -> int:
        """Number of tokens in the row."""
        return int(self.input_ids.shape[0])

    @property
    def num_segments(self) -> int:
        """Number of segments (examples or example parts) in the row."""
        return int(self.cu_seqlens.shape[0]) - 1
