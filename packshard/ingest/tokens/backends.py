r"""Which library encodes rendered text: the reference (``tokenizers``) or a fast one, proven first.

``--backend`` (``pack``, ``profile``) picks the encoder, in this one place:

* ``reference``: Hugging Face ``tokenizers``, as the tokenizer was loaded.
* ``fast``: a fast library (``pip install 'packshard[fast]'``) built from the loaded
  tokenizer's JSON, in the order of :func:`libraries`.  Forced: no canary; a tokenizer no
  library can load, or labels that need offsets, stop the run with one line.
* ``auto`` (the command line's default): ``fast`` only where it proves itself, otherwise
  ``reference`` and one line saying why::

      load ──► a fast library installed? ── no ──► reference ("not installed")
                 │ yes
                 ▼
      labels need offsets? (no ByteAligner) ── yes ──► reference
                 │ no
                 ▼
      for each library, the family's fastest first:
        it loads the tokenizer's JSON? ── no ──► the next library (its error kept)
                 │ yes
                 ▼
        canary: every special and added token (alone, between text, between spaces), byte
        fallback, CJK, emoji, code, whitespace runs, tool-call JSON — ids equal both ways?
                 │ yes                          └─ no ──► the next library (first differing)
                 ▼                                        none left ──► reference (every reason)
      first batch of the input (up to 256 rendered texts) — ids equal both ways?
                 │ yes: that library encodes the run     └─ no ──► reference for the run

The decision is taken once per tokenizer and backend in each process that encodes (cached on
the :class:`~packshard.ingest.tokens.tokenizer.TokenizerBundle`); the units report what
encoded them and the manifest's entry is theirs (:func:`merged_entry`).  Only ids are taken
from a fast encoder: label positions come from the ids
(:mod:`packshard.ingest.tokens.alignment`), and an example whose ids do not spell its text
is encoded again by the reference.  ``verify`` re-encodes with the reference.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from functools import cache
from importlib import metadata
from typing import Any

from packshard.errors import UsageError
from packshard.ingest.tokens.giga import LIBRARY, GigaEncoder
from packshard.ingest.tokens.metaspace import (
    MetaspaceEncoder,
    dump_json,
    encode_flat,
    fast_spec,
    load_json,
)
from packshard.ingest.tokens.tokenizer import TokenizerBundle

FIRST_TEXTS = 256
"""Rendered texts of the first batch encoded both ways before ``auto`` trusts the fast encoder."""
FAST = "fastokens"
GIGA = LIBRARY
REFERENCE = "tokenizers"
INSTALL = "pip install 'packshard[fast]'"

CANARY = (
    "Hello world",
    " leading space",
    "trailing space ",
    "two  spaces   three    four     ",
    "\t\ttabs\tand\r\nCRLF\r\n\r\n",
    "\n\n\n\n",
    "        eight spaces, then a newline\n        ",
    "你好，世界！这是一个测试。繁體中文與日本語のテキスト、한국어 텍스트",
    "𠀀𠀁𪚥 rare CJK outside the BMP",
    "emoji 😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈 and flags 🇫🇷",
    "e\u0301 combining, \u00a0nbsp, \u2003em space, \u3000ideographic space, \u200bzwsp",
    "\x00\x01\x07\x1b\x7f control bytes",
    "\ufffd\U0010fffd\U000e0001 private and tag characters \ue000",
    "Ωμέγα, Кириллица, العربية, עברית, हिन्दी, ไทย",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) { s += a[i] * 2.5e-3; }",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}',
    '<tool_call>\n{"name": "search", "arguments": {"q": "a \\"quoted\\" word"}}\n</tool_call>',
    "1234567890 3.14159 -42 1e10 0x1F",
    "I'm, you're, it's, don't, we'll, they've, I'd",
    "ALLCAPS MixedCase camelCaseWord snake_case_word kebab-case-word",
    "https://example.com/path?q=1&r=2#frag user@example.com",
    "<s></s><unk><pad><|im_start|><|im_end|><|endoftext|>",
    "▁ lower one eighth block ▁▁ and <0x0A> written out",
)
"""Hard strings every run's canary encodes (the tokenizer's own added tokens join them)."""


@cache
def installed_version(name: str) -> str | None:
    """Return the installed distribution version of ``name``, None when it is absent.

    Cached: every work unit's entry names its encoder's version (0.35 ms a lookup).
    """
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


class FastEncoder:
    """``fastokens`` over the tokenizer as loaded: ids only, never offsets."""

    library = FAST

    def __init__(self, bundle: TokenizerBundle) -> None:
        import fastokens

        text = bundle.tokenizer.to_str()
        loaded = load_json(text)
        found = fast_spec(loaded)
        if found is None:
            raise ValueError("its SentencePiece prefix rule is not one packshard models")
        spec, rule = found
        # a JSON fast_spec left as it was goes to fastokens as tokenizers wrote it
        tok = fastokens.Tokenizer.from_json_str(text if spec is loaded else dump_json(spec))
        self._tok = tok
        self._metaspace = MetaspaceEncoder(tok, rule, bundle.tokenizer) if rule else None

    def encode_batch(self, texts: list[str]) -> Sequence[Any]:
        """Encode without special tokens added: ``FlatIds`` (each item has ``ids``)."""
        if self._metaspace is not None:
            return self._metaspace.encode_flat(texts)
        return encode_flat(self._tok, texts)


def libraries(bundle: TokenizerBundle, small_job: bool = False) -> tuple[str, ...]:
    """Return the fast libraries to try for ``bundle``, the fastest on its family first.

    By measurement (:mod:`packshard.ingest.tokens.giga`): gigatoken for a SentencePiece
    vocabulary, fastokens for byte-level BPE, gigatoken first for any in a ``small_job``
    (:data:`~packshard.ingest.types.SMALL_JOB_BYTES`).  Only installed ones are tried.
    """
    tok = bundle.tokenizer
    sentencepiece = type(tok.pre_tokenizer).__name__ == "Metaspace" or bool(
        getattr(tok.model, "byte_fallback", False)
    )
    order = (GIGA, FAST) if sentencepiece or small_job else (FAST, GIGA)
    return tuple(name for name in order if installed_version(name) is not None)


def fast_encoder(
    bundle: TokenizerBundle, library: str | None = None, small_job: bool = False
) -> FastEncoder | GigaEncoder:
    """Return ``library``'s encoder of ``bundle`` (default: the first of :func:`libraries`).

    Built once (a process forked later shares it).  Raises what the encoder's constructor
    raises, and ``ValueError`` when no fast library is installed.
    """
    if library is None:
        found = libraries(bundle, small_job)
        if not found:
            raise ValueError(f"no fast encoder is installed ({INSTALL})")
        library = found[0]
    key = (library, id(bundle.tokenizer))
    with _BUILDING:
        if key not in bundle.encoders:
            bundle.encoders[key] = (GigaEncoder if library == GIGA else FastEncoder)(bundle)
        return bundle.encoders[key]


_BUILDING = threading.Lock()


def canary_texts(bundle: TokenizerBundle) -> list[str]:
    """Return the canary: :data:`CANARY` and every added token, alone and inside text."""
    texts = list(CANARY)
    for token in sorted(t.content for t in bundle.tokenizer.get_added_tokens_decoder().values()):
        texts += [token, f"a{token}b", f" {token} ", f"\n{token}\n", f"{token}{token}x"]
    texts.append("".join(texts))
    return texts


def first_difference(
    bundle: TokenizerBundle, fast: FastEncoder | GigaEncoder, texts: Sequence[str]
) -> str | None:
    """Return where ``fast`` and the reference first differ on ``texts``; None when equal."""
    texts = list(texts)
    want = bundle.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    got = fast.encode_batch(texts)
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if list(w.ids) != list(g.ids):
            return f"text {i} ({texts[i][:24]!r}…) encodes to different ids"
    return None


class Encoder:
    """The encoder one run uses for one tokenizer: decided once, then fixed."""

    def __init__(self, bundle: TokenizerBundle, requested: str, small_job: bool = False) -> None:
        self.bundle, self.requested, self.small_job = bundle, requested, small_job
        self.fast: FastEncoder | GigaEncoder | None = None
        self.reason = f"{requested} requested" if requested != "auto" else ""
        self._proven = requested != "auto"  # fast forced: no check on the first records
        self._lock = threading.Lock()
        if requested != "reference":
            self._try_fast()

    def _refuse(self, why: str) -> None:
        if self.requested == "fast":
            raise UsageError(f"--backend fast: {why} (use --backend auto or reference)")
        self.fast, self.reason = None, why

    def _try_fast(self) -> None:
        """Use the first library of :func:`libraries` that loads (and passes the canary, auto).

        Each refusal is kept; the run's reason is the last library's, with the others'
        before it, so that a fallback says why the faster one was not used.
        """
        if (why := _unusable(self.bundle)) is not None:
            return self._refuse(why)
        refused: list[str] = []
        for library in libraries(self.bundle, self.small_job):
            try:
                fast = fast_encoder(self.bundle, library)
            except Exception as exc:  # the Rust loaders raise ValueError and bare exceptions
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                refused.append(f"{library} cannot load this tokenizer: {first}")
                continue
            if self.requested == "auto":
                where = first_difference(self.bundle, fast, canary_texts(self.bundle))
                if where is not None:
                    refused.append(f"{library} disagrees with tokenizers on the canary: {where}")
                    continue
            self.fast = fast
            self.reason = (
                "; ".join([*refused, "canary equal"]) if self.requested == "auto" else self.reason
            )
            return None
        return self._refuse("; ".join(refused))

    @property
    def name(self) -> str:
        """The library that encodes (``gigatoken``, ``fastokens`` or ``tokenizers``)."""
        return self.fast.library if self.fast is not None else "tokenizers"

    def encode_batch(self, texts: list[str]) -> Sequence[Any]:
        """Encode ``texts`` (no special tokens added) with the chosen library."""
        if self.fast is not None and not self._proven:
            with self._lock:
                if not self._proven and self.fast is not None:
                    where = first_difference(self.bundle, self.fast, texts[:FIRST_TEXTS])
                    if where is not None:  # the reason stays "canary equal" otherwise, as
                        # on workers, where the driver never sees the first records
                        library = self.fast.library
                        self._refuse(f"{library} disagrees with tokenizers on the input: {where}")
                    self._proven = True
        if self.fast is not None:
            return self.fast.encode_batch(texts)
        return self.bundle.tokenizer.encode_batch_fast(texts, add_special_tokens=False)

    def entry(self) -> dict[str, Any]:
        """Return what the manifest's ``environment.backends`` records about encoding."""
        return {
            "name": self.name,
            "version": installed_version(self.name),
            "requested": self.requested,
            "reason": self.reason,
        }


def decided(
    bundle: TokenizerBundle, backend: str, small_job: bool = False
) -> dict[str, Any] | None:
    """Return the entry of the encoder this process decided for ``bundle`` (None: none yet)."""
    with _CHOOSING:
        found = bundle.encoders.get(_key(bundle, backend, small_job))
    return found.entry() if found is not None else None


def merged_entry(entries: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """Return one entry for what encoded the units of ``entries`` (None where none is known).

    Every worker decides for itself (canary, then its first texts), so the units say which
    library encoded them.  When they differ, the entry names the fast library (what the
    audit must re-encode after) and its reason counts the units of each.
    """
    known = [e for e in entries if e]
    kinds = {json.dumps(e, sort_keys=True): e for e in known}
    if len(kinds) <= 1:
        return known[0] if known else None
    counts = Counter(e["name"] for e in known)
    fast = next((e for e in known if e["name"] != REFERENCE), known[0])
    fallback = next((e for e in known if e["name"] == REFERENCE), known[0])
    split = ", ".join(f"{name} in {n} of {len(known)} units" for name, n in sorted(counts.items()))
    return {**fast, "reason": f"{split} ({fallback['name']}: {fallback['reason']})"}


def encoder_for(bundle: TokenizerBundle, backend: str, small_job: bool = False) -> Encoder:
    """Return the run's encoder for ``bundle`` under ``--backend backend`` (decided once).

    ``small_job``: the job is under :data:`~packshard.ingest.types.SMALL_JOB_BYTES` of input
    (:func:`libraries`).
    """
    # keyed by the tokenizer and aligner too: dataclasses.replace shares the dict with a copy
    # (the Encoder holds the bundle, so the tokenizer's id cannot be reused while it is cached)
    key = _key(bundle, backend, small_job)
    with _CHOOSING:
        if key not in bundle.encoders:
            bundle.encoders[key] = Encoder(bundle, backend, small_job)
        return bundle.encoders[key]


def _key(bundle: TokenizerBundle, backend: str, small_job: bool) -> tuple[str, bool, int, int]:
    return (backend, small_job, id(bundle.tokenizer), id(bundle.aligner))


_CHOOSING = threading.Lock()


def check_forced(bundle: TokenizerBundle, backend: str) -> None:
    """Stop a forced ``--backend fast`` at once on the reasons that cost nothing to find.

    Raises:
        UsageError: fastokens is not installed, or labels need offsets.

    """
    if backend == "fast" and (why := _unusable(bundle)) is not None:
        raise UsageError(f"--backend fast: {why} (use --backend auto or reference)")


def _unusable(bundle: TokenizerBundle) -> str | None:
    """Why no fast encoder can encode for ``bundle``, found without loading one."""
    if not libraries(bundle):
        return f"{FAST} is not installed ({INSTALL})"
    if bundle.aligner is None:
        return f"{FAST} gives no offsets, and this tokenizer family's labels need them"
    return None


def warm_encoder(bundle: TokenizerBundle, backend: str, small_job: bool = False) -> None:
    """Decide the run's encoder on a background thread (loading fastokens takes seconds).

    The Rust loader releases the GIL, so the first records are read and rendered meanwhile;
    the first encode waits for the decision (:func:`encoder_for` holds its lock while it is
    made).  A failure is raised again by that first encode, where the run stops.

    The thread is not a daemon: a run that stops early waits for the load before exiting; a
    daemon ended by the shutdown mid-load aborts the process (``FATAL: exception not
    rethrown``, exit 134) after the error line.
    """

    def decide() -> None:
        with suppress(Exception):  # raised again by the first encode
            encoder_for(bundle, backend, small_job)

    if _key(bundle, backend, small_job) not in bundle.encoders:
        threading.Thread(target=decide, name="packshard-encoder").start()


def backends_entry(
    bundle: TokenizerBundle,
    backend: str,
    render: dict[str, Any] | None = None,
    encode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the manifest's ``environment.backends``: what rendered and what encoded.

    ``render`` is the renderer's entry (:mod:`packshard.ingest.template.fast`); None means
    the reference sandbox (Jinja's ``ImmutableSandboxedEnvironment``).  ``encode`` is what
    the work units report (:func:`merged_entry`); None: this process decides.
    """
    return {
        "render": render or {"name": "jinja2", "version": installed_version("jinja2")},
        "encode": encode or encoder_for(bundle, backend).entry(),
    }


def backend_note(entry: dict[str, Any]) -> str | None:
    """One line for the user naming each step (render, encode) ``auto`` left on the reference."""
    lines = []
    render = entry.get("render") or {}
    if render.get("requested") == "auto" and render.get("name") != "minijinja":
        lines.append(f"rendering with jinja2: {render.get('reason')}")
    encode = entry.get("encode") or {}
    if encode.get("requested") == "auto" and encode.get("name") == REFERENCE:
        lines.append(f"encoding with tokenizers: {encode.get('reason')}")
    return f"--backend auto: {'; '.join(lines)}" if lines else None
