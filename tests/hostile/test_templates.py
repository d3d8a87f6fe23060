"""Hostile chat templates: every render is bounded in time and size, and the run goes on.

A battery of templates that loop, recurse, multiply, format or print without bound renders in
one fresh process under a 3 GiB address-space cap and a timeout; each must end as a
``TemplateError`` with its exact reason within a second or so.  A pack whose template bombs on
some records rejects those as ``template_error`` and packs the rest; a template that cannot
even be compiled is a usage error before any record is read.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from packshard.cli.commands import main
from packshard.errors import TemplateError
from packshard.ingest.template.render import compile_template
from tests.helpers import changed, run_capped, tree_state

SIZE = 1 << 20  # the budget the battery runs with: 1 MiB, 0.5 s
SLOW = "template render took more than 0.5 s (a runaway loop or recursion? use --template-timeout"
STEPS = "template made more than 10,000,000 loop iterations and calls in one render"
BITS = "template would build a number of more than 65,536 bits"


def big(n: int, what: str) -> str:
    return (
        f"template would build a value of {n:,} characters ({what}), more than the {SIZE:,} "
        "allowed (use --max-record-bytes to allow more)"
    )


DOUBLED = "{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
BATTERY = {
    # runaway loops and recursion: the deadline or the step count stops them
    "nested range": (
        "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        (SLOW, STEPS),
    ),
    "nested lists": (
        "{% for i in [0] * 99999 %}{% for j in [0] * 99999 %}{% endfor %}{% endfor %}",
        (SLOW, STEPS),
    ),
    "exponential macro": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
        "{% endmacro %}{{ f(60) }}",
        (SLOW, STEPS),
    ),
    "deep macro": (
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        ("template failed: RecursionError: maximum recursion depth exceeded",),
    ),
    "captured output": (
        "{% set x %}{% for i in range(99999) %}{% for j in range(999) %}"
        "{{ 'abcdefghij' * 100 }}{% endfor %}{% endfor %}{% endset %}{{ x }}",
        (SLOW, STEPS, big(1_000_000 + 1000, "string")),
    ),
    # one operation asking for too much: refused before it allocates
    "string times huge": ("{{ 'a' * 10**10 }}", (big(10**10, "string or list"),)),
    "folded constant": ("{{ 'a' * 10000000000 }}", (big(10**10, "string or list"),)),
    "huge power": ("{{ 10 ** 100000000 }}", (BITS,)),
    "squaring loop": (
        "{% set ns = namespace(x=3) %}{% for i in range(40) %}"
        "{% set ns.x = ns.x * ns.x %}{% endfor %}{{ ns.x > 1 }}",
        (BITS,),
    ),
    "doubling string": (
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        (big(1 << 21, "string"),),
    ),
    "lipsum": ("{{ lipsum(n=10**7) }}", (big(10**7 * 100 * 12, "lorem ipsum text"),)),
    "ljust": ("{{ 'a'.ljust(10**10) }}", (big(10**10, "string"),)),
    "to_bytes": ("{{ (1).to_bytes(10**10, 'big') }}", (big(10**10, "byte string"),)),
    "format width": ("{{ '{:>10000000000}'.format(1) }}", (big(10**10, "formatted field"),)),
    "printf width": ("{{ '%*s' % (10**10, 'a') }}", (big(10**10, "formatted field"),)),
    "center filter": ("{{ 'a' | center(10**10) }}", (big(10**10, "centered text"),)),
    "filter via map": (
        "{{ ['a'] | map('center', 10**10) | list }}",
        (big(10**10, "centered text"),),
    ),
    "replace filter": (
        "{{ ('a' * 9999) | replace('a', 'b' * 9999) }}",
        (big(9999 * 9999, "string"),),
    ),
    "join separator": (
        "{{ range(99999) | join('x' * 99999) }}",
        (big(10_000_188_887, "joined text"),),
    ),
    "slice filter": ("{{ [1] | slice(10**8) | list | length }}", (big(10**8, "list"),)),
    "printing shared lists": (
        DOUBLED + "{% endfor %}{{ ns.x }}",
        (SLOW, STEPS, big(SIZE + 2, "printed value")),
    ),
    "tojson shared lists": (
        DOUBLED + "{% endfor %}{{ ns.x | tojson }}",
        (SLOW, STEPS, big(SIZE + 2, "tojson input")),
    ),
    "rendered text": (
        "{% for i in range(99999) %}{{ 'x' * 999 }}{% endfor %}",
        (big(1_054_944, "rendered text"),),
    ),
    # reaching for internals: refused by the sandbox, screened out of the fast renderer
    "underscore item": (
        "{{ messages[0]['__class__'] }}",
        ("underscore item: template tried to leave the sandbox: access to attribute '__class__'",),
    ),
    # passes the fast renderer's screen: minijinja runs it, fails, and the sandbox says why
    "raise in a loop": (
        "{% for m in messages %}{{ raise_exception('no ' ~ m.role) }}{% endfor %}",
        ("template raised: no user (template line 1)",),
    ),
}

DRIVER = """
import json, sys, time
from packshard.errors import TemplateError
from packshard.ingest.template.fast import with_renderer
from packshard.ingest.template.render import compile_template, render_chat
battery = json.loads(sys.argv[1])
backend = sys.argv[2]
messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
for name, text in battery.items():
    started = time.monotonic()
    try:
        template = compile_template(text, name).bounded(1 << 20, 0.5)
        template = with_renderer(template, {}, backend)  # fast: minijinja where screened in
        out = "rendered " + str(len(render_chat(template, messages, None, {})[0]))
    except TemplateError as exc:
        out = str(exc)
    print(json.dumps([name, out, time.monotonic() - started]), flush=True)
"""


@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_every_hostile_template_ends_as_a_template_error_quickly(tmp_path, backend):
    # under the fast renderer each one is screened out or declined by minijinja, and the
    # sandbox rejects the record with its own reason
    battery = {name: text for name, (text, _) in BATTERY.items()}
    done = run_capped([json.dumps(battery), backend], tmp_path, code=DRIVER, seconds=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = {
        name: (out, seconds) for name, out, seconds in map(json.loads, done.stdout.splitlines())
    }
    assert set(results) == set(BATTERY)
    for name, (_, expected) in BATTERY.items():
        out, seconds = results[name]
        assert any(out.startswith(e) for e in expected), (name, out)
        assert seconds < 5, (name, seconds)  # the deadline is 0.5 s, plus a loaded machine


def test_jinja_cannot_fold_a_huge_constant_at_compile_time():
    compile_template("{{ 'a' * 10000000000 }}{{ 'b' | center(10000000000) }}", "fold")  # instant


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{{ " + "(" * 20_000 + "1" + ")" * 20_000 + " }}",
            "t.jinja: template cannot be compiled: nested too deeply (fix the template or choose "
            "another with --template)",
        ),
        (
            "x" * (5 << 20),
            "t.jinja: template is more than 4,194,304 bytes (not a chat template? choose another "
            "with --template)",
        ),
    ],
    ids=["nested", "huge"],
)
def test_a_template_that_cannot_be_compiled_is_a_usage_error(
    tmp_path, word_tokenizer, text, message
):
    (tmp_path / "t.jinja").write_text(text)
    (tmp_path / "d.jsonl").write_text('{"messages": [{"role": "user", "content": "w2"}]}\n')
    argv = ["pack", "d.jsonl", "-t", str(word_tokenizer), "--template", "t.jinja"]
    argv += ["--max-seq-len", "16", "-o", "out"]
    before, cwd = tree_state(tmp_path), os.getcwd()
    os.chdir(tmp_path)
    try:
        result = CliRunner().invoke(main, argv, catch_exceptions=False)
    finally:
        os.chdir(cwd)
    assert (result.exit_code, result.stderr) == (2, f"error: {message}\n")
    assert changed(before, tree_state(tmp_path)) == []
    with pytest.raises(TemplateError):
        compile_template(text, "t.jinja")


BOMB_ON_REQUEST = """{%- for m in messages %}
{%- if m.content == 'boom' %}{{ 'a' * 10**10 }}{% endif %}
{%- if m.content == 'spin' %}{% for i in range(99999) %}{% for j in range(99999) %}
{%- endfor %}{% endfor %}{% endif %}
{{- ' <' + m.role + '> ' + m.content + ' </s> ' }}
{%- endfor %}"""


def test_a_pack_rejects_the_records_a_template_bombs_on_and_packs_the_rest(
    tmp_path, word_tokenizer
):
    (tmp_path / "bomb.jinja").write_text(BOMB_ON_REQUEST)
    records = [
        [("user", "w2"), ("assistant", "w3")],
        [("user", "boom"), ("assistant", "w3")],
        [("user", "w4"), ("assistant", "w5")],
        [("user", "spin"), ("assistant", "w3")],
    ]
    lines = [
        json.dumps({"messages": [{"role": r, "content": c} for r, c in rec]}) for rec in records
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    args = ["pack", "d.jsonl", "-t", word_tokenizer, "--template", "bomb.jinja", "--max-seq-len"]
    args += ["32", "--template-timeout", "0.5", "-o", "out", "--no-progress"]
    done = run_capped(args, tmp_path, seconds=300)
    assert done.returncode == 0, done.stderr
    assert "counts add up: 4 = 2 packed + 2 rejected + 0 dropped" in done.stdout
    got = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["code"]) for r in got] == [(2, "template_error"), (4, "template_error")]
    assert got[0]["reason"] == (
        "template would build a value of 10,000,000,000 characters (string or list), more than "
        "the 16,777,216 allowed (use --max-record-bytes to allow more) (template line 2)"
    )
    assert got[1]["reason"].startswith((SLOW, STEPS))
