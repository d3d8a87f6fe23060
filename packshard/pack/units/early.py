"""The workers' fork server, started before the driver imports the pipeline.

``pack``'s local workers are forked from a server that imports the map module and loads the
tokenizer, the template and the fast encoder once
(:func:`~packshard.pack.units.map.warm_worker`, :mod:`packshard.engine.forkwarm`): about
0.9 s before the first unit can be mapped.  The engine starts it when it opens, after the
driver has imported the pipeline (0.3 s) and claimed the output folder.  The command line
starts it as soon as the options are read instead, so that the two run side by side on two
cores::

    driver        [options][import pipeline, checks, claim OUT ][hash][map …
    fork server            [imports, tokenizer, encoder, warm-up]──► workers
                           ^ started here; by the engine, 0.3 s later, before

This module imports neither the pipeline nor the map module: only the options, the input
list and the engine's starter.  One worker, Ray, or inputs that ``--workers auto`` sizes to
one worker start nothing.
"""

from __future__ import annotations

from packshard.engine import EngineOptions, WarmUp, prestart
from packshard.errors import PackshardError
from packshard.ingest.read.sources import InputFile, expand_inputs
from packshard.ingest.read.splits import input_bytes
from packshard.pack.config import PackConfig

MAP_MODULE = "packshard.pack.units.map"
WARM_FUNCTION = "warm_worker"
EARLY = ("packshard.ingest.loaded", "load_early")


def warm_up(config: PackConfig) -> WarmUp:
    """Return what each worker of ``config`` runs as it starts (in the fork server, once).

    :func:`~packshard.pack.units.map.warm_worker` on the tokenizer, the template and
    ``--backend``, with :func:`~packshard.ingest.loaded.load_early` on a thread beside the
    server's imports.
    """
    args = (config.tokenizer, config.template, config.ingest.backend)
    return WarmUp(MAP_MODULE, WARM_FUNCTION, args, EARLY)


def sized_engine(config: PackConfig, files: list[InputFile]) -> EngineOptions:
    """Return ``config``'s engine with ``--workers auto`` resolved for the bytes of ``files``."""
    return config.engine.sized(input_bytes(files))


def start_early(config: PackConfig) -> None:
    """Start the fork server of ``config``'s local workers now (see the module notes)."""
    engine = config.engine
    if engine.workers is None:  # --workers auto, sized as pack will size it
        try:
            files = expand_inputs(config.inputs + config.eval_inputs)
        except PackshardError:  # pack names the problem itself, in its order
            return
        engine = sized_engine(config, files)
    prestart(engine, warm_up(config))
