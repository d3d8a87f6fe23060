"""Values that cross stages: :func:`packshard.records.quick` builds them as dataclasses do."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from packshard.ingest.label.chat import Chat
from packshard.ingest.label.tiers import Turn
from packshard.ingest.types import Conversation, Message, RawRecord, Rendered
from packshard.records import SourceRef, quick

QUICK = (SourceRef, RawRecord, Message, Conversation, Rendered, Turn, Chat)


@dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: Any
    c: str = "c"
    d: tuple[int, ...] = ()


@quick
@dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: Any
    c: str = "c"
    d: tuple[int, ...] = ()


def test_quick_init_has_the_dataclass_signature_and_values() -> None:
    assert inspect.signature(Quick.__init__) == inspect.signature(Plain.__init__)
    for args, kwargs in [((1, 2), {}), ((1, 2, "x", (3,)), {}), ((1,), {"b": [], "d": (4,)})]:
        got, want = Quick(*args, **kwargs), Plain(*args, **kwargs)
        assert dataclasses.astuple(got) == dataclasses.astuple(want)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        Quick(1)  # a missing argument is still an error
    with pytest.raises(TypeError):
        Quick(1, 2, e=3)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlainKeywords:
    a: int
    c: str = "c"


@quick
@dataclass(frozen=True, slots=True, kw_only=True)
class QuickKeywords:
    a: int
    c: str = "c"


def test_quick_keeps_keyword_only_fields_keyword_only() -> None:
    assert inspect.signature(QuickKeywords.__init__) == inspect.signature(PlainKeywords.__init__)
    got = QuickKeywords(a=1)
    assert (got.a, got.c) == (1, "c")
    with pytest.raises(TypeError):
        QuickKeywords(1)  # type: ignore[misc]


def test_quick_values_stay_frozen() -> None:
    for cls in QUICK:
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert "__slots__" in cls.__dict__
    ref = SourceRef("a.jsonl", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.line = 4  # type: ignore[misc]
    message = dataclasses.replace(Message("user", "hi"), content="there")
    assert (message.role, message.content, message.extra) == ("user", "there", ())
    assert RawRecord(ref, "d") == RawRecord(ref, "d", None, None)
    assert hash(ref) == hash(SourceRef("a.jsonl", 3))


def test_quick_refuses_fields_it_cannot_build() -> None:
    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"Factory\.a "):
        quick(Factory)
