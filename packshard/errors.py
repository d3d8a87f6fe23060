"""One exception hierarchy for every failure packshard reports.

Messages are compiler style: they start with the place (``file:line`` where a record is
involved), say what is wrong, and end with the flag or action that fixes it, e.g.::

    chat.jsonl:1812: example is 9133 tokens > max_seq_len 8192 (use --overlong truncate|split|drop)

Exit codes follow one rule across the command line: 0 ok, 1 data or audit failure, 2 usage
(bad flags, unreadable input, missing files).  ``assert`` is reserved for internal invariants;
data is validated with these exceptions.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_DATA = 1
EXIT_USAGE = 2


class PackshardError(Exception):
    """Base class of every error packshard raises on purpose."""

    exit_code: int = EXIT_DATA


class UsageError(PackshardError):
    """Bad options or arguments: the command cannot start."""

    exit_code = EXIT_USAGE


class InputError(PackshardError):
    """An input file or folder cannot be found or opened."""

    exit_code = EXIT_USAGE


class StreamLimitDataError(InputError):
    """An input opened but its compressed stream breaks a limit (a bomb): the data, exit 1."""

    exit_code = EXIT_DATA


class TokenizerError(PackshardError):
    """A tokenizer cannot be loaded or lacks what the job needs."""

    exit_code = EXIT_USAGE


class TemplateError(PackshardError):
    """A chat template cannot be loaded, compiled or rendered."""

    exit_code = EXIT_USAGE


class RecordError(PackshardError):
    """One input record cannot be used; it becomes a line in ``rejects.jsonl``.

    ``code`` is stable and machine readable (``invalid_json``, ``too_long`` …); ``reason`` is
    for people.  ``str(err)`` is ``source:line: reason``.
    """

    exit_code = EXIT_DATA

    def __init__(self, code: str, reason: str, source: str = "<unknown>", line: int = 0) -> None:
        assert code in REJECT_CODES, f"unregistered reject code {code!r}"
        self.code = code
        self.reason = reason
        self.source = source
        self.line = line
        super().__init__(f"{source}:{line}: {reason}")

    def at(self, source: str, line: int) -> RecordError:
        """Return the same error placed at ``source:line``."""
        return type(self)(self.code, self.reason, source, line)


class ManifestError(PackshardError):
    """A dataset folder's manifest is missing, invalid or of an unsupported version."""

    exit_code = EXIT_USAGE


class FormatError(PackshardError):
    """A file of an output folder is damaged, or belongs to another dataset.

    ``problem`` is the message without the file's name, for reports that name it themselves.
    """

    exit_code = EXIT_DATA

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class NothingToPackError(PackshardError):
    """Every record was rejected or dropped: ``pack`` writes no output folder."""

    exit_code = EXIT_DATA


class OutputError(UsageError):
    """The output folder cannot be used: locked, not packshard's, overlapping an input."""


REJECTED = "rejected"
"""Kind of a reject code: the record is bad input (it failed reading, normalizing or rendering)."""
DROPPED = "dropped"
"""Kind of a reject code: the record was valid and a policy (``--overlong`` …) removed it."""


@dataclass(frozen=True, slots=True)
class RejectCode:
    """A stable, machine-readable reason a record is not packed, and its kind."""

    name: str
    kind: str  # REJECTED or DROPPED
    meaning: str


REJECT_CODES: dict[str, RejectCode] = {
    c.name: c
    for c in (
        RejectCode("invalid_json", REJECTED, "the line or array element is not valid JSON"),
        RejectCode(
            "invalid_utf8",
            REJECTED,
            "the line (or the file, for a JSON array) is not valid UTF-8, or the text holds a "
            "lone surrogate (a JSON escape such as \\ud800 that is no Unicode character)",
        ),
        RejectCode("not_an_object", REJECTED, "the JSON value is not an object"),
        RejectCode(
            "duplicate_key",
            REJECTED,
            "a JSON object holds the same key twice (which value is meant is ambiguous)",
        ),
        RejectCode(
            "too_large",
            REJECTED,
            "the line, array element or Parquet row is larger than --max-record-bytes (it never "
            "reaches the tokenizer)",
        ),
        RejectCode(
            "unreadable",
            REJECTED,
            "a compressed stream or Parquet data broke; the rest of the file is not read",
        ),
        RejectCode(
            "unknown_format",
            REJECTED,
            "no known format key (messages, conversations, instruction+output, "
            "prompt+completion, text)",
        ),
        RejectCode(
            "missing_field", REJECTED, "a field the (forced) format needs is absent or null"
        ),
        RejectCode("empty_conversation", REJECTED, "the message list is empty"),
        RejectCode(
            "invalid_message",
            REJECTED,
            "a message list is not a list, or one message is not an object",
        ),
        RejectCode("unknown_role", REJECTED, "a message has a missing or unsupported role"),
        RejectCode(
            "invalid_content",
            REJECTED,
            "a message's content or a text field is missing or not a string",
        ),
        RejectCode("invalid_tools", REJECTED, "'tools' is neither a list nor a JSON string of one"),
        RejectCode(
            "no_assistant_turn",
            REJECTED,
            "the loss policy needs an assistant turn the record lacks",
        ),
        RejectCode(
            "template_error",
            REJECTED,
            "the chat template raised, or a trained turn cannot be found in its output",
        ),
        RejectCode(
            "no_trainable_tokens",
            REJECTED,
            "no token after the first is trained (the trained turns are empty or dropped, or "
            "flagged untrained)",
        ),
        RejectCode(
            "invalid_reasoning",
            REJECTED,
            "an assistant message's reasoning is not a string, two of its sources disagree, "
            "or it holds the closing marker",
        ),
        RejectCode(
            "invalid_flag",
            REJECTED,
            "a message's 'train' is not true/false, its 'weight' or 'loss_weight' not 0 or 1 "
            "(or the two disagree), or --loss all cannot honour it",
        ),
        RejectCode(
            "reasoning_dropped",
            REJECTED,
            "the template leaves out the reasoning of the conversation's last turn "
            "(use --reasoning drop)",
        ),
        RejectCode(
            "invalid_pair",
            REJECTED,
            "a preference record's answers are not one assistant message each after the "
            "prompt, or its conversations share no prompt",
        ),
        RejectCode(
            "identical_pair", REJECTED, "the chosen and rejected branches render the same tokens"
        ),
        RejectCode(
            "missing_media",
            REJECTED,
            "an image the record names is not a file under the record's folder or --media-root",
        ),
        RejectCode(
            "bad_media",
            REJECTED,
            "an image file's header cannot be read as an image, or its size is one the "
            "vision processor refuses",
        ),
        RejectCode(
            "media_url",
            REJECTED,
            "an image is named by a URL (nothing is downloaded: fetch it and name the file)",
        ),
        RejectCode(
            "media_mismatch",
            REJECTED,
            "the record's image placeholders and its images disagree in number, or the "
            "template writes no vision placeholder for them",
        ),
        RejectCode(
            "video_unsupported",
            REJECTED,
            "the record holds a video, which packshard does not pack yet",
        ),
        RejectCode("too_long", DROPPED, "longer than --max-seq-len under --overlong drop"),
        RejectCode(
            "truncated_no_targets", DROPPED, "no trained token left after --overlong truncate"
        ),
        RejectCode("split_no_targets", DROPPED, "no part kept a trained token after splitting"),
        RejectCode(
            "over_vision_cap",
            DROPPED,
            "an example alone holds more images or vision tokens than "
            "--max-images-per-row / --max-vision-tokens-per-row allow",
        ),
        RejectCode(
            "mix_subsampled",
            DROPPED,
            "left out by --mix: a seeded choice, its domain over its share",
        ),
    )
}
"""Every reject code packshard emits, in the order docs/pack.md lists them."""


def reject_kind(code: str) -> str:
    """Return :data:`REJECTED` or :data:`DROPPED` for a registered reject code."""
    return REJECT_CODES[code].kind
