r"""Load a tokenizer offline, with what rendering and the manifest need from its folder.

:func:`load_tokenizer` reads ``tokenizer.json`` with ``tokenizers`` (never ``transformers``) and
the special tokens, ``add_bos_token`` and chat template from the folder's configs.  Three
adjustments make the ids equal to what ``transformers`` (5.x) produces for the same folder:

* truncation and padding stored in ``tokenizer.json`` are switched off (a shard never
  silently cuts an example);
* BOS/EOS strings become special added tokens, so ``"<s>"`` written as text encodes to its id;
* a SentencePiece conversion whose normalizer prepends ``▁`` to every piece
  (``Prepend("▁") + Replace(" ", "▁")``) gets the prefix once, at the start of the text, when the
  config says ``legacy: false`` (the Llama default): ``<|user|>\nHi`` encodes ``Hi``, not
  ``▁Hi``.  ``TokenizerBundle.adjustments`` names what was changed.

Encoding and labels live in :mod:`packshard.ingest.tokens.labels`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, pre_tokenizers

from packshard.errors import TokenizerError
from packshard.ingest.tokens.aligner import ByteAligner, build_aligner
from packshard.ingest.tokens.metaspace import load_json

NAMED_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


@dataclass(frozen=True)
class TokenizerBundle:
    """A loaded tokenizer with what rendering and the manifest need from its folder."""

    tokenizer: tokenizers.Tokenizer
    path: str
    json_path: Path
    sha256: str
    vocab_size: int
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None
    special_tokens: tuple[str, ...]
    config: dict[str, Any] = field(repr=False)
    special_tokens_map: dict[str, str] = field(default_factory=dict, repr=False)
    adjustments: tuple[str, ...] = ()
    chat_template_path: str | None = None  # a chat_template.jinja beside tokenizer.json
    aligner: ByteAligner | None = field(default=None, repr=False, compare=False)
    # per --backend, the encoder chosen for this tokenizer (packshard.ingest.tokens.backends)
    encoders: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def manifest_entry(self) -> dict[str, Any]:
        """Return what the manifest records about the tokenizer."""
        return {
            "path": self.path,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }


def _read_json(path: Path) -> dict[str, Any]:
    """Return the JSON object in ``path``; ``{}`` when there is no such file."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer file: {exc}") from exc
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: expected a JSON object, found {type(value).__name__}")
    return value


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_chat_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return _token_text(entry.get("template")) or entry.get("template")
    return None


def _prefix_once(tok: tokenizers.Tokenizer, spec: dict[str, Any], config: dict[str, Any]) -> str:
    """Apply the SentencePiece prefix rule ``transformers`` applies; return a note, or ''.

    ``transformers`` 5 rebuilds a ``LlamaTokenizer`` with a prepend scheme from the config
    (``first``; ``always`` with ``legacy: true``; ``never`` with ``add_prefix_space: false``);
    another class keeps the file's pipeline unless the config says ``legacy: false``.
    """
    norm = spec.get("normalizer") or {}
    steps = norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    kinds = sorted(step.get("type", "") for step in steps)
    prepends = kinds == ["Prepend", "Replace"] and spec.get("pre_tokenizer") is None
    if prepends and not any(s.get("type") == "Prepend" and s.get("prepend") == "▁" for s in steps):
        return ""
    pre = spec.get("pre_tokenizer") or {}
    metaspace = not norm and pre.get("type") == "Metaspace" and pre.get("replacement") == "▁"
    legacy = config.get("legacy")
    llama = str(config.get("tokenizer_class", "")).startswith("LlamaTokenizer")
    if llama and (prepends or metaspace):
        scheme = "always" if legacy else "first"
    elif prepends and legacy is False:
        scheme = "first"
    else:
        return ""
    if config.get("add_prefix_space") is False:
        scheme = "never"
    if metaspace and pre.get("prepend_scheme") == scheme and pre.get("split") is False:
        return ""
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=scheme, split=False
    )
    return f"sentencepiece prefix space: {scheme} (legacy={'true' if legacy else 'false'})"


def _post_processor_adds_bos(tok: tokenizers.Tokenizer, bos_id: int | None) -> bool:
    if bos_id is None:
        return False
    ids = tok.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos_id and tok.encode("a", add_special_tokens=False).ids != ids


def _id_bound(tok: tokenizers.Tokenizer, model: Any, added: dict[int, Any]) -> int:
    """One more than the largest token id: the entry count, unless the ids leave gaps.

    A vocabulary may skip ids (special tokens placed far above the learned ones); the ids a
    model must embed, and the range ``verify`` accepts, run up to the largest one.
    """
    count = int(tok.get_vocab_size(with_added_tokens=True))
    vocab = model.get("vocab") if isinstance(model, dict) else None
    top = max(vocab.values(), default=-1) if isinstance(vocab, dict) else -1
    return max(count, top + 1, max(added, default=-1) + 1)


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
"""``owner/name`` of the Hugging Face Hub (a path that does not exist and looks like one)."""


def tokenizer_json_path(path: str) -> Path:
    """Return the ``tokenizer.json`` that ``path`` names (the file, or the one in a folder).

    Raises:
        TokenizerError: there is no such regular file.

    """
    given = Path(path)
    json_path = given / "tokenizer.json" if given.is_dir() else given
    if not json_path.is_file():
        if not given.exists() and HUB_NAME.fullmatch(path) and given.suffix != ".json":
            raise TokenizerError(
                f"{path}: no such file or folder; a Hugging Face Hub name? packshard never "
                f"downloads: fetch the tokenizer folder (huggingface-cli download {path} "
                f"tokenizer.json tokenizer_config.json --local-dir {given.name}) and pass "
                f"-t {given.name}"
            )
        where = "folder holds no tokenizer.json" if given.is_dir() else "no such file"
        raise TokenizerError(
            f"{path}: {where} (pass a tokenizer.json or its folder with --tokenizer)"
        )
    return json_path


def load_tokenizer(path: str) -> TokenizerBundle:
    """Load ``path`` (a ``tokenizer.json`` or a folder holding one) without any network access.

    ``tokenizer_config.json`` supplies the special tokens, ``add_bos_token`` and the chat
    template (``special_tokens_map.json`` fills gaps; ``chat_template.jinja`` replaces the
    config's template, as in ``transformers``).

    Raises:
        TokenizerError: the file is missing, unreadable or not a tokenizer.

    """
    json_path = tokenizer_json_path(path)
    raw = json_path.read_bytes()
    try:
        spec = load_json(raw)  # {} for JSON that is no object: from_str refuses it
        tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # the Rust loader raises a bare Exception
        raise TokenizerError(f"{json_path}: not a valid tokenizer.json: {exc}") from exc
    folder = json_path.parent
    config = _read_json(folder / "tokenizer_config.json")
    fallback = _read_json(folder / "special_tokens_map.json")

    chat_template = _pick_chat_template(config.get("chat_template"))
    template_path = None
    if (folder / "chat_template.jinja").is_file():  # transformers prefers it to the config's
        template_path = str(folder / "chat_template.jinja")
        try:
            chat_template = Path(template_path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenizerError(f"{template_path}: cannot read chat template: {exc}") from exc

    adjustments: list[str] = []
    if tok.truncation is not None or tok.padding is not None:
        tok.no_truncation()
        tok.no_padding()
        adjustments.append("truncation and padding disabled")
    if note := _prefix_once(tok, spec, config):
        adjustments.append(note)

    found = {k: _token_text(config.get(k)) or _token_text(fallback.get(k)) for k in NAMED_SPECIAL}
    named = {key: text for key, text in found.items() if text is not None}
    added = tok.get_added_tokens_decoder()
    added_text = {tok_.content for tok_ in added.values()}
    for key in ("bos_token", "eos_token"):
        text = named.get(key)
        if text is not None and text not in added_text and tok.token_to_id(text) is not None:
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
            adjustments.append(f"{key} {text!r} registered as a special token")
            added = tok.get_added_tokens_decoder()

    def ident(key: str) -> int | None:
        return tok.token_to_id(named[key]) if key in named else None

    bos_id = ident("bos_token")
    add_bos = config.get("add_bos_token")
    model = spec.get("model")
    return TokenizerBundle(
        tokenizer=tok,
        path=path,
        json_path=json_path,
        sha256=hashlib.sha256(raw).hexdigest(),
        vocab_size=_id_bound(tok, model, added),
        bos_token=named.get("bos_token"),
        eos_token=named.get("eos_token"),
        pad_token=named.get("pad_token"),
        bos_token_id=bos_id,
        eos_token_id=ident("eos_token"),
        pad_token_id=ident("pad_token"),
        add_bos_token=add_bos
        if isinstance(add_bos, bool)
        else _post_processor_adds_bos(tok, bos_id),
        chat_template=chat_template,
        special_tokens=tuple(t.content for _, t in sorted(added.items()) if t.special),
        config=config,
        special_tokens_map=named,
        adjustments=tuple(adjustments),
        chat_template_path=template_path,
        aligner=build_aligner(tok, model),
    )
