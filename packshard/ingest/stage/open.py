"""The stage opened once: tokenizer, template and backends loaded and checked in one place.

``pack``, ``profile`` and ``verify`` each open the stage with :func:`open_stage` before any
record is read, and every check runs here, in this order::

    load_tokenizer(spec) ─► load_template(spec, bundle)
        ─► check_markers      each template marker one token (unless --allow-split-markers)
        ─► check_forced       --backend fast: installed and usable, else stop now
        ─► renderer_for       --backend auto|fast: the fast renderer proven (canary) once
        ─► Stage(spec, bundle, template)

The :class:`StageSpec` is what a worker needs to load the same stage again
(:func:`~packshard.ingest.stage.loaded.loaded`).  The manifest's tokenizer, template and
backends entries come from the stage too (:meth:`Stage.entries`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packshard.ingest.label.reasoning import reasoning_field
from packshard.ingest.stage.loaded import sharing
from packshard.ingest.stage.markers import check_markers
from packshard.ingest.stream import ingest_label_path
from packshard.ingest.template.fast import render_entry, renderer_for
from packshard.ingest.template.render import ChatTemplate, load_template
from packshard.ingest.tokens.backends import backend_note, backends_entry, check_forced
from packshard.ingest.tokens.tokenizer import TokenizerBundle, load_tokenizer
from packshard.ingest.types import IngestOptions, StageSpec


@dataclass(frozen=True, slots=True)
class StageEntries:
    """The manifest's entries for what the stage used."""

    tokenizer: dict[str, Any]
    template: dict[str, Any]
    backends: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stage:
    """The loaded, checked stage: its spec, tokenizer and compiled template."""

    spec: StageSpec
    bundle: TokenizerBundle
    template: ChatTemplate | None

    def shared(self) -> AbstractContextManager[None]:
        """While open, tasks run in this process use this stage instead of loading it again."""
        return sharing_stage(self.spec, lambda: self)

    @property
    def label_path(self) -> str:
        """How the labels are found when no example says otherwise (``tags``, ``search`` …)."""
        return ingest_label_path(self.template, self.spec.options.loss)

    def backends(self, encoded: dict[str, Any] | None = None) -> dict[str, Any]:
        """Return the manifest's ``environment.backends``; ``encoded``: what the units reported."""
        backend = self.spec.options.backend
        variables = self.bundle.special_tokens_map
        rendered = render_entry(self.template, variables, backend)
        return backends_entry(self.bundle, backend, rendered, encoded)

    def backend_note(self, encoded: dict[str, Any] | None = None) -> str | None:
        """One line naming each step ``--backend auto`` left on the reference, or None."""
        return backend_note(self.backends(encoded))

    def entries(self, encoded: dict[str, Any] | None = None) -> StageEntries:
        """Return the manifest's tokenizer, template and backends entries."""
        bundle, template = self.bundle, self.template
        tokenizer = {**bundle.manifest_entry(), "resolved": str(Path(bundle.path).resolve())}
        entry: dict[str, Any] = {"source": None, "sha256": None, "label_spans": "none"}
        if template is not None:
            entry = {
                "source": template.source,
                "sha256": template.sha256,
                "label_spans": "none" if self.spec.options.loss == "all" else template.label_spans,
                "reasoning_field": reasoning_field(template),
            }
            if Path(template.source).is_file():  # a file (not builtin:NAME, not the config)
                entry["resolved"] = str(Path(template.source).resolve())
        return StageEntries(tokenizer, entry, self.backends(encoded))


@contextmanager
def sharing_stage(spec: StageSpec, stage: Callable[[], Stage]) -> Iterator[None]:
    """While open, tasks of ``spec`` run in this process get ``stage()``'s tokenizer and template.

    ``stage`` may wait for a stage still being opened (``pack`` opens it on a thread while its
    workers map): the first task that needs it waits then.
    """

    def pair() -> tuple[TokenizerBundle, ChatTemplate | None]:
        opened = stage()
        return opened.bundle, opened.template

    with sharing(spec.tokenizer, spec.template, pair):
        yield


def open_stage(
    tokenizer: str,
    template: str | None,
    options: IngestOptions,
    allow_split_markers: bool = False,
) -> Stage:
    """Load the tokenizer and template of the specs and run every check on them once.

    Raises:
        TokenizerError: the tokenizer cannot be loaded.
        TemplateError: the template cannot be loaded, or a marker of it splits.
        UsageError: ``--backend fast`` cannot be used here.

    """
    bundle = load_tokenizer(tokenizer)
    chat = load_template(template, bundle)
    check_markers(bundle, chat, allow_split_markers)
    check_forced(bundle, options.backend)  # before any record is read
    if chat is not None and options.backend != "reference":
        renderer_for(chat, bundle.special_tokens_map, options.backend)
    return Stage(StageSpec(tokenizer, template, options), bundle, chat)
