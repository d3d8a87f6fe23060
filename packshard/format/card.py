"""The dataset card ``README.md``: what ``datasets.load_dataset(OUT)`` reads, and a person too.

An output folder holds two kinds of Parquet file with different schemas, the shards and the
examples index.  Without a card, ``datasets`` would load every ``*.parquet`` as one split and
fail on the second schema.  The card's YAML front matter names them as two configurations::

    ---
    configs:
    - {"config_name": "default", "default": true, "description": "packshard rows 49b4d4e35813e627",
       "data_files": [{"split": "train", "path": ["shard-00000.parquet", …]}]}   (one line each)
    - {"config_name": "examples", "description": "packshard examples 0c…", "data_files": […]}
    tags:
    - packshard
    ---

so ``load_dataset(OUT)`` gives the packed rows and ``load_dataset(OUT, "examples")`` the index.
A pack with an eval split (``--eval-fraction``, ``--eval``) has a third, ``eval``, naming the
``eval-shard-*`` files (``load_dataset(OUT, "eval", split="eval")``); ``default`` keeps the
train shards only.
Every configuration is one JSON object on one line (YAML flow style), read back by
:func:`card_configs` without a YAML library.  Shards are listed by name, never by glob.  Each
``description`` is 16 hex digits of the SHA-256 of its files' SHA-256s: ``datasets`` caches a
local folder by its name and its card's configurations, so two folders named ``out`` would
otherwise share one cache entry.  Below the front matter the card tells a person what the
folder is and how to verify and train on it.  It is rendered from the manifest alone (never
``created_at``), so the same inputs give the same bytes; ``pack`` writes it before the
manifest, which lists it, and ``verify`` checks it (:func:`card_problem`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packshard.digests import sha256_bytes, sha256_path

CARD_NAME = "README.md"


def front_matter(manifest: Mapping[str, Any]) -> str:
    """Return the card's YAML front matter (with its ``---`` lines) for ``manifest``."""
    entries = manifest.get("shards", [])
    train = [s for s in entries if s.get("split", "train") == "train"]
    held = [s for s in entries if s.get("split", "train") == "eval"]
    index = {"path": "examples.parquet", **manifest.get("files", {}).get("examples", {})}
    configs = [
        _config("default", "rows", train, default=True),
        _config("examples", "examples", [index]),
    ]
    if held:  # the eval split: load_dataset(OUT, "eval", split="eval")
        configs.append(_config("eval", "eval", held, "eval"))
    lines = ["---", "configs:", *(f"- {json.dumps(c)}" for c in configs)]
    return "\n".join([*lines, "tags:", "- packshard", "---", ""])


def _config(
    name: str, what: str, files: list[Mapping[str, Any]], split: str = "train", **first: Any
) -> dict[str, Any]:
    """Return one configuration: its ``files`` by name, described by a hash of their SHA-256s.

    The hash (16 hex digits of their SHA-256s joined) is the key ``datasets`` caches them under.
    """
    digests = "\n".join(str(f.get("sha256")) for f in files)
    return {
        "config_name": name,
        **first,
        "description": f"packshard {what} {sha256_bytes(digests.encode('utf-8'))[:16]}",
        "data_files": [{"split": split, "path": [str(f["path"]) for f in files]}],
    }


def render_card(manifest: Mapping[str, Any]) -> str:
    """Return the whole card: front matter, then what the folder is and how to use it."""
    config, stats = manifest.get("config", {}), manifest.get("stats", {})
    tok, tmpl, loss = manifest.get("tokenizer", {}), manifest.get("template", {}), manifest["loss"]
    by_format = ", ".join(f"{k} → {v}" for k, v in sorted(loss.get("by_format", {}).items()))

    def n(key: str) -> str:
        return f"{int(stats.get(key, 0)):,}"

    shards = f"{len(manifest.get('shards', [])):,}"
    facts = [
        ("dataset id", f"`{manifest.get('dataset_id')}`"),
        (
            "tokenizer",
            f"`{tok.get('path')}` (sha256 `{tok.get('sha256')}`), vocabulary "
            f"{int(tok.get('vocab_size') or 0):,}",
        ),
        (
            "chat template",
            f"`{tmpl.get('source')}` (sha256 `{tmpl.get('sha256')}`), trained "
            f"spans found by {tmpl.get('label_spans')}",
        ),
        ("max_seq_len", f"{config.get('max_seq_len')} tokens per row"),
        (
            "packing",
            f"strategy {config.get('strategy')}, overlong {config.get('overlong')}, "
            f"positions {config.get('position_ids')}, row shuffle seed {config.get('seed')}",
        ),
        ("loss", f"{loss.get('option')}" + (f" ({by_format})" if by_format else "")),
        (
            "records",
            f"{n('records')} read = {n('records_packed')} packed + {n('rejected')} "
            f"rejected + {n('dropped')} dropped (see `rejects.jsonl`)",
        ),
        ("examples / rows / shards", f"{n('examples')} / {n('rows')} / {shards}"),
        ("tokens / loss tokens", f"{n('tokens')} / {n('loss_tokens')}"),
        (
            "fill rate",
            f"{100 * float(stats.get('fill_rate', 0.0)):.2f}% of rows × max_seq_len "
            f"(lower bound {n('lower_bound_rows')} rows)",
        ),
    ]
    if splits := stats.get("splits"):
        facts.append(
            (
                "train / eval examples",
                " / ".join(f"{int(splits[k]['examples']):,}" for k in ("train", "eval"))
                + f' (eval: `load_dataset(OUT, "eval", split="eval")`, {config.get("eval")})',
            )
        )
    table = "\n".join(f"| {k} | {v} |" for k, v in facts)
    body = BODY.format(version=manifest.get("format_version"), table=table)
    return front_matter(manifest) + body


BODY = """
# Packed fine-tuning data (packshard format {version})

Written by `packshard pack`: chat examples tokenized with the tokenizer below and packed
several to a row, every boundary recorded. Nothing is padded; no example attends to, or is
trained on, another as long as its row's segments are kept apart.

| | |
| --- | --- |
{table}

## Files

- `shard-*.parquet`: one packed row per Parquet row. `input_ids`, `labels` (-100 = no loss,
  unshifted; the first label of every segment is -100), `position_ids` (restart at 0 in
  every segment), `cu_seqlens` (`[0, end_1, …, num_tokens]`), `seq_lengths`
  (`diff(cu_seqlens)`), `example_ids` (keys into `examples.parquet`), `num_tokens`,
  `num_loss_tokens`, `max_seqlen`.
- `examples.parquet`: one row per packed example: its source file and line, domain, token
  counts, and the shard and row it sits in.
- `rejects.jsonl`: every record that was not packed, with file, line and reason.
- `manifest.json`: configuration, hashes of the inputs, tokenizer and template, statistics,
  and the SHA-256 of every file here (this card included).

## Check it

```console
$ packshard verify OUT      # integrity, seams, source reconstruction, packed-vs-alone model check
```

## Load it

```python
from datasets import load_dataset
rows = load_dataset("OUT", split="train")                 # the packed rows
examples = load_dataset("OUT", "examples", split="train") # the examples index
```

The rows are already packed: a trainer must keep their segments apart. With TRL, train
padding-free on `seq_lengths`: `SFTConfig(padding_free=True, packing=False, max_length=None)`,
no custom collator. Never re-pack them (TRL `packing=True`, `DataCollatorWithFlattening`):
each row would become one sequence and examples would attend to each other. For other
trainers, `packshard.torch` reads this folder (`PackedDataset`, `PackedIterableDataset`,
`collate_hf`, `check_trainer`), and `packshard export OUT --to megatron|torchtune|mds|unpacked`
converts it.
"""


def write_card(folder: Path, manifest: Mapping[str, Any]) -> dict[str, str]:
    """Write ``folder/README.md`` for ``manifest``; return its manifest ``files`` entry."""
    path = folder / CARD_NAME
    path.write_text(render_card(manifest), encoding="utf-8")
    return {"path": CARD_NAME, "sha256": sha256_path(path)}


def card_configs(text: str) -> list[dict[str, Any]]:
    """Return the ``configs`` of a card written by :func:`write_card`.

    Raises:
        ValueError: no front matter, no ``configs``, or an entry that is not one JSON object.

    """
    lines = text.split("\n")
    if not lines or lines[0] != "---" or "---" not in lines[1:]:
        raise ValueError("no YAML front matter")
    block = lines[1 : lines.index("---", 1)]
    if "configs:" not in block:
        raise ValueError("no configs in its front matter")
    configs = []
    for line in block[block.index("configs:") + 1 :]:
        if not line.startswith("- "):
            break
        try:
            entry = json.loads(line[2:])
        except json.JSONDecodeError as exc:
            raise ValueError(f"a configs entry is not one JSON object: {exc}") from None
        if not isinstance(entry, dict):
            raise ValueError("a configs entry is not an object")
        configs.append(entry)
    return configs


def card_problem(folder: Path, manifest: Mapping[str, Any]) -> str | None:
    """Say why the card would not load this folder's shards and index, or None when it does."""
    path = folder / str(manifest.get("files", {}).get("card", {}).get("path", CARD_NAME))
    try:
        configs = card_configs(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"unreadable dataset card: {exc}"
    expected = {c["config_name"]: c for c in card_configs(front_matter(manifest))}
    found = {str(c.get("config_name")): c for c in configs}
    defaults = [name for name, c in found.items() if c.get("default") or name == "default"]
    if defaults != ["default"]:
        return f"the card's default configs are {defaults}, expected ['default']"
    for name, want in expected.items():
        if found.get(name, {}).get("data_files") != want["data_files"]:
            return (
                f"the card's config {name!r} does not name the manifest's files "
                "(load_dataset would read other files than the manifest lists)"
            )
    return None
