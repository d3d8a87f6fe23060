"""The fast renderer (minijinja): the sandbox's text, spans and rejects, or the sandbox itself.

* the screen refuses every construct outside the listed ones (macros, ``*``, ``range``,
  underscore names, doubling ``set``, loops over more than their outer item …);
* ``{% generation %}`` spans come out where the sandbox's recorder puts them;
* a record the fast renderer cannot prove (U+001C–U+001F, the marker characters, fuel, size,
  ``raise_exception``) is rendered by the sandbox: same text or same reject;
* ``auto`` renders the canary both ways; a renderer that differs falls back with one line.
"""

from __future__ import annotations

import pytest

from packshard.errors import TemplateError
from packshard.ingest.template import fast
from packshard.ingest.template.fast import Renderer, with_renderer
from packshard.ingest.template.render import CHATML, compile_template, render_chat
from packshard.ingest.template.screen import screen

pytest.importorskip("minijinja")

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "héllo 😀 {{ not a tag }}"},
    {"role": "assistant", "content": "  two  spaces\n"},
    {"role": "user", "content": "ok"},
    {"role": "assistant", "content": "bye"},
]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "ünï", "z": 1, "a": 2}}]


def _both(text: str, messages=CHAT, tools=None, prompt=False, limit=1 << 20):
    template = compile_template(text, "t.jinja").bounded(limit, 60.0)  # a busy machine
    routed = with_renderer(template, {}, "fast")
    assert routed is not None and routed.fast is not None, screen(text)
    return routed, template


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{% macro f() %}x{% endmacro %}{{ f() }}", "Macro"),
        ("{{ 'a' * 3 }}", "Mul"),
        ("{{ 2 ** 3 }}", "Pow"),
        ("{% for i in range(3) %}{% endfor %}", "call"),
        ("{{ messages.__class__ }}", "attribute '__class__'"),
        ("{{ messages | join('x') }}", "filter 'join'"),
        ("{{ 'a'.ljust(9) }}", "method 'ljust'"),
        ("{% set ns = namespace(s='a') %}{% set ns.s = ns.s ~ ns.s %}", "set reading two"),
        ("{% for m in messages %}{% for n in messages %}{% endfor %}{% endfor %}", "nested"),
        ("{% for m in messages recursive %}{% endfor %}", "recursive"),
        ("{% set x %}a{% endset %}", "AssignBlock"),
        ("{% filter upper %}a{% endfilter %}", "FilterBlock"),
        ("{% include 'x' %}", "Include"),
        ("{{ '\ufdd0' }}", "marker"),
    ],
)
def test_the_screen_refuses_what_it_does_not_list(text, why):
    found = screen(text)
    assert found is not None and why in found, found
    assert with_renderer(compile_template(text, "t"), {}, "fast").fast is None  # the sandbox


def test_chatml_renders_the_same_text_and_generation_spans():
    routed, template = _both(CHATML)
    assert routed.fast.fast is not None
    for prompt in (False, True):
        for tools in (None, TOOLS):
            got = routed.fast.render(routed, CHAT, tools, {}, prompt)
            assert got is not None
            assert got == render_chat(template, CHAT, tools, {}, prompt)
    text, spans = render_chat(routed, CHAT, None, {})
    assert [text[a:b] for a, b in spans] == ["  two  spaces\n<|im_end|>", "bye<|im_end|>"]


def test_tojson_keeps_key_order_and_unicode_like_the_sandbox():
    text = "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}"
    routed, template = _both(text)
    got = routed.fast.render(routed, CHAT, TOOLS, {}, False)
    assert got == render_chat(template, CHAT, TOOLS, {})
    assert '"z": 1, "a": 2' in got[0] and "ünï" in got[0]


STRIPPED = "{% for m in messages %}[{{ m.content.strip() }}]{% endfor %}"
SPLIT = "{% for m in messages %}[{{ m.content.split() | length }}]{% endfor %}"
TRIMMED = "{% for m in messages %}[{{ m.content | trim }}]{% endfor %}"
TAGGED = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
PRINTED = "{% for m in messages %}[{{ m.content }}] {{ m.content | length }}{% endfor %}"
SEPARATORS = "\x1cseparator stripped by Python only\x1f"


@pytest.mark.parametrize(
    ("text", "content", "fast"),
    [
        (STRIPPED, SEPARATORS, False),  # Python strips U+001C-U+001F, Rust does not
        (SPLIT, SEPARATORS, False),
        (TRIMMED, SEPARATORS, False),
        (TAGGED, "marker \ufdd0", False),  # the generation markers
        (TAGGED, "marker \ufdd1", False),
        (PRINTED, SEPARATORS, True),  # nothing reads whitespace, no tags: minijinja may
        (PRINTED, "marker \ufdd0 \ufdd1", True),
        (STRIPPED, "marker \ufdd0", True),
    ],
)
def test_a_record_the_fast_renderer_cannot_prove_is_rendered_by_the_sandbox(text, content, fast):
    routed, template = _both(text)
    chat = [{"role": "user", "content": content}]
    assert (routed.fast.render(routed, chat, None, {}, False) is not None) is fast
    assert render_chat(routed, chat, None, {}) == render_chat(template, chat, None, {})


def test_raise_exception_is_the_sandboxs_reject():
    text = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}"
    routed, _ = _both(text)
    with pytest.raises(TemplateError, match=r"^template raised: system first \(template line 1"):
        render_chat(routed, CHAT[1:], None, {})


def test_over_fuel_or_size_the_sandbox_renders_or_rejects():
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    many = [{"role": "user", "content": "x"}] * 50_000  # fuel: 64 MiB / 1.3 MB of record: 50
    routed, _ = _both(text)
    assert routed.fast.render(routed, many, None, {}, False) is None
    assert render_chat(routed, many, None, {})[0] == "x" * 50_000
    small, _ = _both(text, limit=1000)
    big = [{"role": "user", "content": "y" * 2000}]
    assert small.fast.render(small, big, None, {}, False) is None
    with pytest.raises(TemplateError, match="rendered text"):
        render_chat(small, big, None, {})


def test_auto_falls_back_with_one_line_when_the_canary_differs(monkeypatch):
    template = compile_template(CHATML, "builtin:chatml")
    real = fast.FastRenderer.render

    def corrupt(self, *args):
        got = real(self, *args)
        return None if got is None else (got[0].replace("é", "e"), got[1])

    monkeypatch.setattr(fast.FastRenderer, "render", corrupt)
    renderer = Renderer(template, {}, "auto")
    assert renderer.fast is None and renderer.name == "jinja2"
    assert renderer.reason.startswith("minijinja differs on the canary: ")
    assert Renderer(template, {}, "fast").name == "minijinja"  # forced: trusted


def test_without_minijinja_auto_is_the_sandbox_and_fast_stops(monkeypatch):
    from packshard.errors import UsageError

    template = compile_template(CHATML, "builtin:chatml")
    monkeypatch.setattr(fast, "installed_version", lambda name: None)
    renderer = Renderer(template, {}, "auto")
    assert renderer.fast is None
    assert renderer.reason == "minijinja is not installed (pip install 'packshard[fast]')"
    with pytest.raises(UsageError, match="--backend fast: minijinja is not installed"):
        Renderer(template, {}, "fast")


def test_a_pack_without_minijinja_says_once_that_it_renders_in_the_sandbox(
    tmp_path, demo_tokenizer, monkeypatch
):
    from packshard.demo import demo_data_path
    from packshard.pack import PackConfig, pack_dataset

    monkeypatch.setattr(fast, "_RENDERERS", {})  # a fresh process: nothing decided yet
    real = fast.installed_version
    monkeypatch.setattr(
        fast, "installed_version", lambda name: None if name == "minijinja" else real(name)
    )
    config = PackConfig.build(
        inputs=(str(demo_data_path()),),
        tokenizer=str(demo_tokenizer),
        out=str(tmp_path / "out"),
        max_seq_len=256,
        template="chatml",
    )
    result = pack_dataset(config)
    notes = [w for w in result.warnings if "--backend" in w]
    assert notes == [
        "--backend auto: rendering with jinja2: minijinja is not installed "
        "(pip install 'packshard[fast]')"
    ]
    render = result.manifest["environment"]["backends"]["render"]
    assert render["name"] == "jinja2" and render["requested"] == "auto"


def test_one_line_names_each_step_auto_left_on_the_reference():
    from packshard.ingest.tokens.backends import backend_note

    why = "is not installed (pip install 'packshard[fast]')"
    both = {
        "render": {"name": "jinja2", "requested": "auto", "reason": f"minijinja {why}"},
        "encode": {"name": "tokenizers", "requested": "auto", "reason": f"fastokens {why}"},
    }
    assert backend_note(both) == (
        f"--backend auto: rendering with jinja2: minijinja {why}; "
        f"encoding with tokenizers: fastokens {why}"
    )
    fast = {"name": "minijinja", "requested": "auto", "reason": "canary equal"}
    assert backend_note({**both, "render": fast}) == (
        f"--backend auto: encoding with tokenizers: fastokens {why}"
    )
    assert (
        backend_note({"render": {"name": "jinja2"}, "encode": {"requested": "reference"}}) is None
    )
