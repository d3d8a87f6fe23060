r"""What one render of an untrusted template may cost: a deadline, an output size, loop steps.

The sandbox stops a template from reaching outside; this module stops it from running forever
or filling memory.  Each render runs under a :class:`Budget` (a deadline, at most
``max_chars`` characters for any string or list it builds, at most ``MAX_STEPS`` loop
iterations and calls), held in the context-local :data:`BUDGET`.  The sandbox
(:mod:`packshard.ingest.template.sandbox`) consults it wherever a template can make work grow::

    {% for %} …              every loop's iterations are steps (a list's length at once)
    f(), macro(), x.method()  environment.call: a step, and amplifying arguments checked
                              first ('a'.ljust(10**10), lipsum(n=10**7), (1).to_bytes(10**10);
                              :func:`check_call`)
    a * b, a + b, a ** b, %   intercepted binary operators: the result's size is computed
                              before the operation (a string or list length, an integer's bits)
    a ~ b, {% set %}…, macros every join of output checked before it is made
    filters                   center/indent/format/replace/wordwrap/join/batch/slice checked
                              (:func:`check_filters`)
    str.format                field widths and precisions checked
    the rendered text         counted piece by piece as it is produced (render_chat)

Checks happen before the work, so one huge operation fails fast instead of allocating (nor
can Jinja fold ``'a' * 10**10`` into a constant at compile time).  An overrun raises
:class:`TemplateBudgetError`: the record becomes a ``template_error`` reject and the run goes
on.  No thread or signal: the deadline is read with ``time.monotonic`` at each step.

Amplifying calls and filters (:func:`check_call`, :func:`check_filters`) compute the
result's size from the arguments; filters that print their input (``string``, ``lower``,
``format`` …) check its printed size, which shared references can make huge
(``[[x] * 1000] * 1000``).
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2.utils import Namespace

from packshard.errors import TemplateError
from packshard.options import MAX_RECORD_BYTES, TEMPLATE_SECONDS

MAX_STEPS = 10_000_000
"""Loop iterations and calls one render may make."""
MAX_INT_BITS = 1 << 16
"""Largest integer (in bits) an operator may produce inside a template."""
_CHECK_EVERY = 255  # steps between two reads of the clock
SHORT_LOOP = 64  # a loop this short is counted at once instead of item by item
BIG = 4096  # a value built of more items than this costs a step per BIG items


class TemplateBudgetError(TemplateError):
    """A template render went over its time, size or step budget."""


class TemplateRunawayError(TemplateBudgetError):
    """A template render went over its time or step budget: it loops, whatever the record."""


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """The budget of one render: at most ``max_chars`` per value, ``seconds`` of time."""

    max_chars: int = MAX_RECORD_BYTES
    seconds: float = TEMPLATE_SECONDS


@dataclass(slots=True)
class Budget:
    """The budget of the render under way (mutable: it counts steps)."""

    limits: RenderLimits
    deadline: float = 0.0
    steps: int = 0

    @staticmethod
    def start(limits: RenderLimits) -> Budget:
        """Return a fresh budget whose clock starts now."""
        return Budget(limits, time.monotonic() + limits.seconds)

    def step(self, n: int = 1) -> None:
        """Count ``n`` loop iterations or calls; read the clock every few steps."""
        before, self.steps = self.steps, self.steps + n
        if (before ^ self.steps) > _CHECK_EVERY or not self.steps & _CHECK_EVERY:
            if self.steps > MAX_STEPS:
                raise TemplateRunawayError(
                    f"template made more than {MAX_STEPS:,} loop iterations and calls in one "
                    "render (a runaway loop?)"
                )
            if time.monotonic() > self.deadline:
                raise TemplateRunawayError(
                    f"template render took more than {self.limits.seconds:g} s (a runaway loop "
                    "or recursion? use --template-timeout to allow more)"
                )

    def size(self, n: float, what: str = "value") -> None:
        """Raise when a value of ``n`` characters (or items) would exceed the budget."""
        if n > self.limits.max_chars:
            if math.isinf(n):
                raise TemplateBudgetError(
                    f"template would build a {what} of more than {MAX_INT_BITS:,} bits"
                )
            raise TemplateBudgetError(
                f"template would build a value of {int(n):,} characters ({what}), more than "
                f"the {self.limits.max_chars:,} allowed (use --max-record-bytes to allow more)"
            )


BUDGET: ContextVar[Budget | None] = ContextVar("packshard_render_budget", default=None)


def current() -> Budget:
    """Return the running render's budget; outside a render (compiling), a fresh one."""
    return BUDGET.get() or Budget.start(RenderLimits())


def checked_loop(iterable: Iterable[Any]) -> Iterable[Any]:
    """Count a loop's iterations as budget steps (every template loop runs through it).

    A short sized iterable (a conversation's messages) is counted at once, by its length, and
    iterated as it is; anything else is wrapped to count one step per item, so the clock is
    read every few iterations of a long loop.
    """
    budget = current()
    if isinstance(iterable, list | tuple | dict | str | range) and len(iterable) <= SHORT_LOOP:
        budget.step(len(iterable) + 1)
        return iterable
    return _stepped(iterable, budget)


def _stepped(iterable: Iterable[Any], budget: Budget) -> Iterator[Any]:
    for item in iterable:
        budget.step()
        yield item


def check_printed(value: Any, what: str = "printed value") -> Any:
    """Return ``value`` after refusing one whose printed form exceeds the budget.

    The characters ``str(value)`` would have are counted, shared references each time they
    are printed, stopping once past the limit (which bounds the walk's own cost).
    """
    if type(value) is str:
        return value
    budget = current()
    stack, total, limit = [value], 0, budget.limits.max_chars
    while stack and total <= limit:
        item = stack.pop()
        budget.step()
        kind = type(item)
        if kind is str:
            total += len(item) + 2
        elif kind is int:
            total += item.bit_length() // 3 + 2
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            if total <= limit:
                stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            if total <= limit:
                stack.extend(item.keys())
                stack.extend(item.values())
        elif isinstance(item, Namespace):
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
        else:
            total += 24
    budget.size(total, what)
    return value


def checked_join(seq: Iterable[Any]) -> str:
    """Join output pieces as Jinja does, after checking the result's size."""
    budget, parts = current(), []
    for part in seq:
        if type(part) is not str:
            check_printed(part)
            part = str(part)
        parts.append(part)
    total = sum(map(len, parts))
    budget.size(total, "string")
    budget.step(total // BIG)
    return "".join(parts)


def _length(value: Any) -> int | None:
    return len(value) if isinstance(value, str | list | tuple) else None


def _int_bits(value: Any) -> int:
    return value.bit_length() if type(value) is int else 0


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse ``left operator right`` when its result would exceed the budget.

    A large result (a string or list of more than ``BIG`` items) also costs a step per
    ``BIG`` items: building it takes time, and steps are when the clock is read.
    """
    budget = current()
    if operator == "+":
        a, b = _length(left), _length(right)
        if a is not None and b is not None:
            budget.size(a + b, "string or list")
            budget.step((a + b) // BIG)
    elif operator == "*":
        for seq, times in ((left, right), (right, left)):
            n = _length(seq)
            if n is not None and type(times) is int:
                budget.size(n * max(times, 0), "string or list")
                budget.step(n * max(times, 0) // BIG)
        if _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
            budget.size(math.inf, "number")
    elif operator == "**":
        if type(left) is int and type(right) is int and right > 0 and abs(left) > 1:
            if _int_bits(left) * right > MAX_INT_BITS:
                budget.size(math.inf, "number")
    elif operator == "%" and isinstance(left, str):
        check_printf(left, right)


_PRINTF = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def check_printf(fmt: str, args: Any) -> None:
    """Refuse a ``%`` format whose widths or precisions (given or ``*``) exceed the budget."""
    budget = current()
    values = args if isinstance(args, tuple) else (args,)
    check_printed(args, "formatted arguments")
    for m in _PRINTF.finditer(fmt):
        for part in m.groups():
            if part == "*":
                for value in values:
                    if type(value) is int:
                        budget.size(value, "formatted field")
            elif part:
                budget.size(int(part[:20]), "formatted field")


def check_format_spec(spec: str) -> None:
    """Refuse a ``str.format`` field whose width or precision exceeds the budget."""
    for run in _DIGITS.findall(spec):  # a width, a precision (or a digit as fill)
        current().size(int(run[:20]), "formatted field")


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
