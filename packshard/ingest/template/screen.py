r"""The screen: which chat templates the fast renderer may run, decided on Jinja's parse tree.

minijinja (:mod:`packshard.ingest.template.fast`) bounds a render's steps with fuel, not the
sizes of the values it builds; the sandbox bounds both
(:mod:`packshard.ingest.template.budget`).  So minijinja only runs templates whose values
cannot grow faster than the record, which this screen proves from the parse tree::

    allowed                                   refused (the sandbox renders the template)
    {{ }}, if, for (not recursive)            macros, call / filter / set blocks, include
    a nested for over part of its outer item  a nested for over anything else (n² steps)
    set x = … reading ≤ 1 variable that is    set x = x ~ x  (a value doubling per step)
      itself set (linear growth)
    + - ~ and or not, comparisons, [i], [a:b]  * ** % / (repetition, formatting)
    filters length count string tojson trim   join, replace, center, indent, format, map …
      first last list items default lower upper
    namespace() raise_exception() strftime_now() range(), lipsum(), any other call
    .strip .lstrip .rstrip .split .startswith .ljust, .format, .join, .replace …
      .endswith .get .items .keys .values .lower .upper
    any other name or attribute               a name or attribute starting with ``_``
    {% generation %} at the top level         nested generation blocks, raw blocks, the
                                              marker characters U+FDD0/U+FDD1 anywhere

Generation tags are then rewritten (:func:`rewrite`) to print :data:`OPEN` / :data:`CLOSE`;
a tag count that differs from the parse tree's blocks (a tag inside a string) refuses the
template.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import nodes

from packshard.ingest.template.sandbox import is_generation, make_environment

OPEN, CLOSE = "\ufdd0", "\ufdd1"
"""The characters a rewritten ``{% generation %}`` and ``{% endgeneration %}`` print."""

_NODES = frozenset(
    "Template Output TemplateData If For Assign Name Const Compare Operand Getitem Getattr "
    "Slice Add Sub Neg Pos Not And Or Concat CondExpr Filter Test Call Keyword NSRef List "
    "Tuple Dict Pair Continue Break CallBlock ExtensionAttribute".split()
)
_FILTERS = frozenset(
    "length count string tojson trim first last list items default d lower upper".split()
)
_TESTS = frozenset(
    "defined undefined none false true string mapping sequence iterable number boolean "
    "integer float eq equalto ne".split()
)
_FUNCTIONS = frozenset(("namespace", "raise_exception", "strftime_now"))
_METHODS = frozenset(
    "strip lstrip rstrip split startswith endswith get items keys values lower upper".split()
)
_WHITESPACE = frozenset(("trim", "strip", "lstrip", "rstrip", "split"))
_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)
_TAG = re.compile(r"\{%([-+]?)\s*(end)?generation\s*([-+]?)%\}")


def _names(node: nodes.Node) -> list[Any]:
    """``node`` and every node under it that names a variable (a Name or a namespace ref)."""
    found = [node] if isinstance(node, (nodes.Name, nodes.NSRef)) else []
    return found + list(node.find_all((nodes.Name, nodes.NSRef)))


def _screen_node(node: nodes.Node, assigned: set[str], loops: tuple[str, ...]) -> str | None:
    kind = type(node).__name__
    if kind not in _NODES:
        return f"{kind} ({node.lineno})"
    if isinstance(node, nodes.CallBlock) and not is_generation(node):
        return f"call block (line {node.lineno})"
    if isinstance(node, nodes.Getattr) and node.attr.startswith("_"):
        return f"attribute {node.attr!r} (line {node.lineno})"
    if isinstance(node, nodes.Name) and node.name.startswith("_"):
        return f"name {node.name!r} (line {node.lineno})"
    if isinstance(node, nodes.Const) and isinstance(node.value, str):
        if node.value.startswith("_") or OPEN in node.value or CLOSE in node.value:
            return f"constant {node.value[:16]!r} (line {node.lineno})"
    if isinstance(node, nodes.Filter) and node.name not in _FILTERS:
        return f"filter {node.name!r} (line {node.lineno})"
    if isinstance(node, nodes.Test) and node.name not in _TESTS:
        return f"test {node.name!r} (line {node.lineno})"
    if isinstance(node, nodes.Call) and not isinstance(node.node, nodes.ExtensionAttribute):
        callee = node.node
        if isinstance(callee, nodes.Getattr):
            if callee.attr not in _METHODS:
                return f"method {callee.attr!r} (line {node.lineno})"
        elif not (isinstance(callee, nodes.Name) and callee.name in _FUNCTIONS):
            return f"call (line {node.lineno})"
        if node.dyn_args is not None or node.dyn_kwargs is not None:
            return f"call with * or ** (line {node.lineno})"
    if isinstance(node, nodes.Assign):
        loads = [n for n in _names(node.node) if getattr(n, "ctx", "") == "load"]
        if sum(n.name in assigned for n in loads) > 1:
            return f"set reading two variables that are set (line {node.lineno})"
    if isinstance(node, nodes.For):
        if node.recursive:
            return f"recursive loop (line {node.lineno})"
        if loops and not _part_of(node.iter, loops[-1]):
            return f"nested loop over more than its outer item (line {node.lineno})"
        target = node.target.name if isinstance(node.target, nodes.Name) else ""
        if not target:
            return f"loop unpacking its item (line {node.lineno})"
        tests = () if node.test is None else (node.test,)
        for child in (node.target, node.iter, *tests):
            if (why := _screen_node(child, assigned, loops)) is not None:
                return why
        for child in (*node.body, *node.else_):
            if (why := _screen_node(child, assigned, (*loops, target))) is not None:
                return why
        return None
    for child in node.iter_child_nodes():
        if (why := _screen_node(child, assigned, loops)) is not None:
            return why
    return None


def _part_of(expr: nodes.Node, item: str) -> bool:
    while isinstance(expr, (nodes.Getattr, nodes.Getitem)):
        if isinstance(expr, nodes.Getitem) and not isinstance(expr.arg, nodes.Const):
            return False
        expr = expr.node
    return isinstance(expr, nodes.Name) and expr.name == item


def screen(text: str) -> str | None:
    """Return why minijinja may not render ``text``; None when the screen passes it."""
    tree = make_environment().parse(text)
    if "{% raw" in text or "{%- raw" in text or OPEN in text or CLOSE in text:
        return "raw blocks or marker characters"
    blocks = [n for n in tree.find_all(nodes.CallBlock) if is_generation(n)]
    tags = [m.group(2) for m in _TAG.finditer(_COMMENT.sub("", text))]
    if tags.count(None) != len(blocks) or tags.count("end") != len(blocks):
        return "{% generation %} tags the screen cannot count"
    if any(is_generation(n) for b in blocks for n in b.find_all(nodes.CallBlock)):
        return "nested {% generation %} blocks"
    assigned = {n.name for a in tree.find_all(nodes.Assign) for n in _names(a.target)}
    return _screen_node(tree, assigned, ())


def reads_whitespace(text: str) -> bool:
    """Tell whether a screened template trims or splits a string on whitespace.

    Only there can Python and Rust differ on the text of a record: Python's ``str.strip``
    and ``str.split`` take U+001C–U+001F for whitespace, Rust's do not.  Every other
    operation the screen allows treats those characters alike.
    """
    tree = make_environment().parse(text)
    if any(n.name in _WHITESPACE for n in tree.find_all(nodes.Filter)):
        return True
    calls = (n.node for n in tree.find_all(nodes.Call))
    return any(isinstance(c, nodes.Getattr) and c.attr in _WHITESPACE for c in calls)


def rewrite(text: str) -> str:
    """Rewrite the generation tags to print the markers, their whitespace control kept."""

    def one(m: re.Match[str]) -> str:
        mark = "packshard_close" if m.group(2) else "packshard_open"
        return f"{{%{m.group(1)} if true %}}{{{{ {mark} }}}}{{% endif {m.group(3)}%}}"

    return _TAG.sub(one, text)
