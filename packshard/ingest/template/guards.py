"""The calls and filters a template can amplify its input with, checked against its budget.

``'a'.ljust(10**10)``, ``'x'.replace('x', y)``, ``(1).to_bytes(10**10)`` or
``s | indent(10**6)`` each ask for a result far larger than their input.  :func:`check_call`
(every call from a template goes through it, via the sandbox's ``call``) and the wrapped
filters (:func:`check_filters`) compute the result's size from the arguments first and raise
:class:`~packshard.ingest.template.budget.TemplateBudgetError` before anything is allocated.
Filters
that print their input (``string``, ``lower``, ``format`` …) check its printed size, which
shared references can make huge (``[[x] * 1000] * 1000``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from packshard.ingest.template.budget import BIG, check_printed, check_printf, current

_WIDTH_METHODS = frozenset(("ljust", "rjust", "center", "zfill"))


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Count a call and refuse one whose arguments ask for more than the budget."""
    budget = current()
    budget.step()
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str):
        if name in _WIDTH_METHODS and args and type(args[0]) is int:
            budget.size(args[0], "string")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if type(tab) is int:
                budget.size(len(owner) + owner.count("\t") * tab, "string")
        elif name == "replace" and len(args) >= 2:
            check_replace(owner, args[0], args[1])
        elif name == "join" and args:
            items = args[0] if isinstance(args[0], list | tuple) else ()
            budget.size(len(owner) * max(len(items) - 1, 0), "string")
    elif type(owner) is int and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        if type(length) is int:
            budget.size(length, "byte string")


def check_replace(text: Any, old: Any, new: Any) -> None:
    """Refuse a replacement whose result would exceed the budget."""
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        current().size(len(text) + hits * (len(new) - len(old)), "string")


def check_result(value: Any) -> Any:
    """Refuse a call's result larger than the budget (a last check after the call)."""
    if isinstance(value, str | list | tuple):
        budget = current()
        budget.size(len(value), "value")
        budget.step(len(value) // BIG)
    return value


def _check_indent(s: Any, width: Any = 4, *_: Any, **__: Any) -> None:
    unit = width if type(width) is int else len(str(width))
    text = str(s)
    current().size(len(text) + (text.count("\n") + 1) * unit, "indented text")


def _check_center(value: Any, width: Any = 80, *_: Any) -> None:
    if type(width) is int:
        current().size(width, "centered text")


def _check_format(value: Any, *args: Any, **kwargs: Any) -> None:
    check_printf(str(value), kwargs or args)


def _check_replace(s: Any, old: Any = "", new: Any = "", *_: Any, **__: Any) -> None:
    check_replace(str(s), str(old), str(new))


def _check_wordwrap(
    s: Any, width: Any = 79, _long: Any = True, wrapstring: Any = None, *_: Any, **__: Any
) -> None:
    if type(width) is int and width > 0:
        joint = len(str(wrapstring)) if wrapstring is not None else 1
        current().size(len(str(s)) * (1 + joint / width), "wrapped text")


def _check_count(value: Any, count: Any = 1, *_: Any, **__: Any) -> None:
    if type(count) is int:
        current().size(count, "list")


def _join(func: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(func)
    def join(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
        items = list(value)
        size = len(str(d)) * max(len(items) - 1, 0)
        if attribute is None and not eval_ctx.autoescape:
            items = [str(x) for x in items]
            size += sum(map(len, items))
        current().size(size, "joined text")
        return func(eval_ctx, items, d, attribute)

    return join


_FILTER_CHECKS: dict[str, Callable[..., None]] = {
    "indent": _check_indent,
    "center": _check_center,
    "format": _check_format,
    "replace": _check_replace,
    "wordwrap": _check_wordwrap,
    "batch": _check_count,
    "slice": _check_count,
}


_STRINGIFY = frozenset(
    "string pprint safe escape e forceescape lower upper title capitalize trim striptags "
    "truncate wordcount wordwrap center indent replace urlize urlencode format xmlattr".split()
)
"""Filters that turn their input into text first (``str([[x] * 1000] * 1000)`` is huge)."""


def _checked(func: Callable[..., Any], check: Callable[..., None] | None) -> Callable[..., Any]:
    passed = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # context, env

    @functools.wraps(func)  # keeps jinja's pass_context / pass_environment marks
    def run(*args: Any, **kwargs: Any) -> Any:
        if len(args) > passed:
            check_printed(args[passed], "filter input")
        if check is not None:
            check(*args[passed:], **kwargs)
        return func(*args, **kwargs)

    return run


def check_filters(filters: dict[str, Any]) -> None:
    """Wrap the filters that print or amplify their input: sizes are checked first."""
    for name in sorted(_STRINGIFY | set(_FILTER_CHECKS)):
        if name in filters:
            filters[name] = _checked(filters[name], _FILTER_CHECKS.get(name))
    filters["join"] = _join(filters["join"])
