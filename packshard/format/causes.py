"""The likely cause of many rejects of one code, and the sniffs of a ``.jsonl`` file's head.

When most records of a run are rejected, one code usually dominates and points at one
mistake: ``missing_field`` under a forced ``--format`` (records of another format),
``not_an_object`` / ``invalid_json`` on every line of a ``.jsonl`` file that holds one JSON
array (``[`` on its first line: rename it to ``.json``) or whose lines end with CR alone
(classic Mac line endings: no LF in its first 64 KiB), ``unknown_format`` for a field name
packshard does not know.  :func:`likely_cause` turns the dominant code into the fix to name,
for the reject-rate line and for the error of a run that packs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from packshard.errors import REJECT_CODES

_CAUSES = {
    "missing_field": "a field the format needs is absent: a wrong field name?",
    "unknown_format": "the records hold none of messages, conversations, instruction+output, "
    "prompt+completion, text: a wrong field name? (convert them, or --format FORMAT)",
    "not_an_object": "each line is not a JSON object: a JSON array saved as .jsonl? (rename "
    "it to .json)",
    "invalid_json": "the lines are not JSON: a JSON array saved as .jsonl (rename it to "
    ".json), or not JSON Lines at all",
    "invalid_utf8": "the file is not UTF-8 (re-encode it)",
    "too_large": "records are larger than --max-record-bytes (raise it)",
    "unknown_role": "message roles are not system/user/assistant/tool (map them first)",
    "template_error": "the chat template fails on these records (check --template)",
    "no_assistant_turn": "--loss needs assistant turns (use --loss all for plain text)",
    "no_trainable_tokens": "no token is trained (check --loss and the messages' train flags)",
    "invalid_content": "message contents are neither strings nor text parts (images or "
    "audio? leave them out)",
    "invalid_message": "the message lists are not lists of objects",
}
_ARRAY_CODES = ("not_an_object", "invalid_json")


def likely_cause(code: str, forced_format: str = "auto", sources: Iterable[str] = ()) -> str:
    """Return the likely cause of many rejects of ``code`` (``sources``: the input files)."""
    if forced_format != "auto" and code in ("missing_field", "unknown_format", "invalid_content"):
        return f"--format {forced_format} is forced on records of other formats (use --format auto)"
    if code in _ARRAY_CODES:
        heads = list(_jsonl_heads(sources))
        cr_only = [path for path, head in heads if b"\r" in head and b"\n" not in head]
        if cr_only:
            return (
                f"{cr_only[0]} ends its lines with CR alone (classic Mac line endings): JSON "
                "Lines needs LF (convert them, e.g. tr '\\r' '\\n')"
            )
        arrays = [path for path, head in heads if head.lstrip(_SPACE).startswith(b"[")]
        if arrays:
            return f"{arrays[0]} looks like a JSON array, not JSON Lines (rename it to .json)"
    return _CAUSES.get(code, REJECT_CODES[code].meaning)


_SPACE = b"\xef\xbb\xbf \t\r\n"


def _jsonl_heads(paths: Iterable[str]) -> Iterable[tuple[str, bytes]]:
    """Yield each readable ``.jsonl`` file among ``paths`` with its first 64 KiB."""
    for path in paths:
        if not str(path).endswith(".jsonl"):
            continue
        try:
            with open(path, "rb") as fh:
                yield str(path), fh.read(64 << 10)
        except OSError:
            continue
